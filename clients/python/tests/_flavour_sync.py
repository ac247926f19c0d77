"""What the blocking unit tests (``test_unit_sync.py``, generated from
``test_unit_async.py``) run under: plain pytest."""

import pytest

#: The mark of every test in the module (registered in pyproject.toml).
mark = pytest.mark.blocking
