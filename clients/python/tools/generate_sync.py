"""Writes the blocking client from the asyncio one.

``src/tidings/_async/client.py`` is the only source of the client's logic;
this script turns it into ``src/tidings/_sync/client.py`` (and the asyncio
tests, ``tests/test_unit_async.py`` and ``tests/test_scenarios_async.py``,
into their ``_sync`` twins)
with unasync (the
token rewriting supabase's clients use): ``async`` and ``await`` go, the
``Async`` names become the blocking ones, and ``_io`` (which each flavour
has of its own) does what differs in more. ``--check`` writes nothing and
fails when the committed file is not what it would write (the suite runs
it: tests/api/python_client.rs).

    python tools/generate_sync.py          # rewrite the blocking files
    python tools/generate_sync.py --check  # is it up to date?
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
#: Each file written from the asyncio one: the client, and its unit tests.
PAIRS = {
    ROOT / "src/tidings/_async/client.py": ROOT / "src/tidings/_sync/client.py",
    ROOT / "tests/test_unit_async.py": ROOT / "tests/test_unit_sync.py",
    ROOT / "tests/test_scenarios_async.py": ROOT / "tests/test_scenarios_sync.py",
}

#: The asyncio names and their blocking twins, beyond unasync's own
#: (``__aiter__``, ``AsyncIterator``, ...).
REPLACEMENTS = {
    "AsyncClient": "Client",
    "AsyncStream": "Stream",
    "AsyncConsumer": "Consumer",
    "AsyncDevice": "Device",
    "_AsyncSession": "_Session",
    "aclose": "close",
    "aread": "read",
    "aiter_text": "iter_text",
    "__anext__": "__next__",
    "_flavour_async": "_flavour_sync",
}

HEADER = """# Generated from {source} by tools/generate_sync.py: edit
# that file and run `python tools/generate_sync.py`; the suite fails when this
# file is not what it writes.
"""


def generated(source: Path) -> str:
    """What the blocking twin of `source` must hold."""
    rule = unasync.Rule(fromdir="/_async/", todir="/_sync/", additional_replacements=REPLACEMENTS)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "_async" / "source.py"
        copy.parent.mkdir()
        shutil.copyfile(source, copy)
        unasync.unasync_files([str(copy)], [rule])
        text = (Path(scratch) / "_sync" / "source.py").read_text(encoding="utf-8")
    return HEADER.format(source=source.relative_to(ROOT).as_posix()) + text


def main(argv: list[str]) -> int:
    if argv[1:] not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    stale = []
    for source, target in PAIRS.items():
        text = generated(source)
        if argv[1:] == ["--check"]:
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                stale.append(target.relative_to(ROOT).as_posix())
        else:
            target.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path} is stale: run `python tools/generate_sync.py`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
