"""The runtime lock is what ``pip install .`` needs, no less and no more, at the development lock's pins.

Servers and the Dockerfile install ``requirements-runtime.lock`` with ``--no-deps``; a package missing
from it breaks them only there, and a pin differing from ``requirements.lock`` would run a version the
tests never ran against. The requirements are read from the installed packages' metadata, which
``make install`` put there from ``requirements.lock``.
"""

from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

REPO = Path(__file__).resolve().parents[2]
#: pip freeze never lists these on Python 3.11, so neither lock does; the Makefile and the Dockerfile
#: install them at fixed versions before a lock.
FREEZE_OMITS = frozenset({"pip", "setuptools", "wheel", "distribute"})
DEV_ONLY = ("pytest", "ruff", "mutmut", "moto", "playwright", "hypothesis")


def _pins(lock: str) -> dict[NormalizedName, str]:
    """name -> version of every ``name==version`` line of a lock file."""
    pins = {}
    for line in (REPO / lock).read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _install_requires() -> list[Requirement]:
    """setup.py's install_requires, read from its syntax: running setup.py would build the package."""
    tree = ast.parse((REPO / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    value = next(keyword.value for keyword in call.keywords if keyword.arg == "install_requires")
    return [Requirement(text) for text in ast.literal_eval(value)]


def _applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    """Whether pip installs ``requirement`` of a package asked for with ``extras``, on this machine."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def _runtime_closure() -> set[NormalizedName]:
    """Every package ``pip install .`` installs here: install_requires, followed through the requirements
    (and the requested extras, such as feast[redis]) of the installed distributions."""
    wanted = _install_requires()
    seen: set[tuple[NormalizedName, frozenset[str]]] = set()
    while wanted:
        requirement = wanted.pop()
        name, extras = canonicalize_name(requirement.name), frozenset(requirement.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        wanted += [sub for sub in map(Requirement, metadata.requires(name) or []) if _applies(sub, extras)]
    return {name for name, _ in seen}


def test_every_runtime_pin_is_the_development_locks_pin():
    runtime, development = _pins("requirements-runtime.lock"), _pins("requirements.lock")
    differing = {
        name: (pin, development.get(name)) for name, pin in runtime.items() if development.get(name) != pin
    }
    assert runtime
    assert differing == {}


def test_every_install_requires_package_is_in_the_runtime_lock():
    runtime = _pins("requirements-runtime.lock")
    assert {canonicalize_name(r.name) for r in _install_requires()} - runtime.keys() == set()


def test_no_development_tool_is_in_the_runtime_lock():
    runtime = _pins("requirements-runtime.lock")
    assert set(DEV_ONLY) & runtime.keys() == set()


def test_runtime_lock_is_closed_under_its_packages_requirements():
    runtime = _pins("requirements-runtime.lock")
    missing = {
        f"{name} needs {requirement.name}"
        for name in runtime
        for requirement in map(Requirement, metadata.requires(name) or [])
        if _applies(requirement, frozenset())
        and canonicalize_name(requirement.name) not in runtime.keys() | FREEZE_OMITS
    }
    assert missing == set()


def test_runtime_lock_is_exactly_what_the_runtime_requirements_pull_in():
    # extras asked for (feast[redis]) count here, and a package nothing requires is caught too
    assert _runtime_closure() - FREEZE_OMITS == _pins("requirements-runtime.lock").keys()
