"""What the asyncio unit tests (``test_unit_async.py``) run under: anyio's
pytest plugin, on asyncio. ``_flavour_sync.py`` is the blocking twin."""

import pytest

#: The mark of every test in the module.
mark = pytest.mark.anyio
