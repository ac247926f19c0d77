"""The asyncio client (`client.py`, the source of both flavours) and its `_io`."""
