"""The package as declared: ``requirements-test.txt`` is the lock of what
``pyproject.toml`` asks for (the runtime dependencies and the ``test``
dependency group), every package in it pinned, and every pin within what
the project declares. (The wheel built from it is installed into a clean
virtual environment and used by tests/api/python_client.rs.)"""

from __future__ import annotations

import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent


def declared() -> list[Requirement]:
    assert sys.version_info >= (3, 11), "the suite runs Python 3.11 or later (tomllib)"
    if sys.version_info >= (3, 11):
        import tomllib

        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        return [Requirement(r) for r in project["project"]["dependencies"] + project["dependency-groups"]["test"]]
    return []


def locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements-test.txt").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"not pinned: {line!r}"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def test_the_lock_pins_everything_the_project_declares_within_its_bounds() -> None:
    pins = locked()
    requirements = declared()
    assert len(requirements) >= 10
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements-test.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {requirement}"
