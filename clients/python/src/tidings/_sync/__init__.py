"""The blocking client (`client.py`, generated from `_async/client.py`) and its `_io`."""
