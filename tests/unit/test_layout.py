"""The repository's layout holds: every import of ours names a module that exists, under our namespace.

Moving a module leaves callers behind that a partial test run may never import (a notebook, a benchmark,
a function-level import); this reads every import statement instead of running them. ``pipelines/``,
``serving/`` and ``features/`` are installed as ``recsys_rl.pipelines``, ``recsys_rl.serving`` and
``recsys_rl.feature_repo`` (setup.py), so their bare names must not be imported anywhere: in a user's
environment they would resolve to someone else's package, or to nothing.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: setup.py's package_dir: where each installed package lives in the checkout.
PACKAGE_DIRS = {
    "recsys_rl.pipelines": REPO / "pipelines",
    "recsys_rl.serving": REPO / "serving",
    "recsys_rl.feature_repo": REPO / "features",
    "recsys_rl": REPO / "recsys_rl",
}
#: Our folders that are installed under another name: importing them by their folder name is the bug.
UNINSTALLED_NAMES = {"pipelines", "serving", "features"}
SOURCE_DIRS = ("recsys_rl", "pipelines", "serving", "features", "bench", "tests")


def _sources() -> list[tuple[str, str]]:
    """(where, Python source) for every module and every notebook code cell we ship or test."""
    found = []
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                found.append((str(path.relative_to(REPO)), path.read_text()))
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if cell["cell_type"] == "code":
                code = "".join(cell["source"])
                # IPython magics are not Python
                lines = [line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))]
                found.append((f"{path.relative_to(REPO)} cell {i}", "\n".join(lines)))
    return found


def _imports(source: str) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) for every absolute import statement in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [alias.name for alias in node.names]))
    return out


def module_file(module: str) -> Path | None:
    """The file that defines ``module`` in the checkout, as the installed wheel maps it; None if none."""
    for package, directory in PACKAGE_DIRS.items():
        if module == package or module.startswith(package + "."):
            path = (
                directory.joinpath(*module[len(package) :].lstrip(".").split("."))
                if module != package
                else directory
            )
            for candidate in (path / "__init__.py", path.with_suffix(".py"), path.with_suffix(".pyi")):
                if candidate.is_file():
                    return candidate
            return None
    raise ValueError(f"{module!r} is not one of our modules")


def _resolves(module: str, names: list[str]) -> bool:
    """Whether ``from module import names`` (or ``import module``) would find each name in the checkout."""
    if module_file(module) is None:
        return False
    defined = _defined_names(module) if names else set()
    return all(name == "*" or name in defined or module_file(f"{module}.{name}") for name in names)


def _defined_names(module: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(module_file(module).read_text())):
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(t.id for t in ast.walk(target) if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def stale_imports(sources: list[tuple[str, str]]) -> list[str]:
    return [
        f"{where}: {module} {names}"
        for where, source in sources
        for module, names in _imports(source)
        if module.split(".")[0] == "recsys_rl" and not _resolves(module, names)
    ]


def bare_imports(sources: list[tuple[str, str]]) -> list[str]:
    return [
        f"{where}: {module}"
        for where, source in sources
        for module, _ in _imports(source)
        if module.split(".")[0] in UNINSTALLED_NAMES
    ]


def test_every_import_of_ours_names_an_existing_module() -> None:
    assert stale_imports(_sources()) == []


def test_no_module_imports_our_folders_by_their_uninstalled_names() -> None:
    assert bare_imports(_sources()) == []


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("from recsys_rl.gate import GateConfig", id="moved-module"),
        pytest.param("import recsys_rl.serving.features", id="renamed-module"),
        pytest.param("from recsys_rl.registry import not_a_name", id="missing-name"),
        pytest.param("from recsys_rl.ope import evaluation", id="missing-submodule"),
    ],
)
def test_a_stale_import_is_found(source: str) -> None:
    assert stale_imports([("planted", source)]) == [
        f"planted: {_imports(source)[0][0]} {_imports(source)[0][1]}"
    ]


@pytest.mark.parametrize(
    "source", ["from serving import wire", "import pipelines.transitions", "import features"]
)
def test_a_bare_import_is_found(source: str) -> None:
    assert len(bare_imports([("planted", source)])) == 1


def test_current_imports_resolve() -> None:
    # the resolver accepts each form that the layout really uses
    good = [
        "from recsys_rl.registry import promote",
        "from recsys_rl.ope import estimators",
        "import recsys_rl.serving.server",
        "from recsys_rl.feature_repo import REPO_DIR",
        "from recsys_rl.pipelines.transitions import build_pipeline",
    ]
    assert stale_imports([("good", source) for source in good]) == []


def test_no_two_library_modules_share_a_base_name_without_saying_why() -> None:
    """Same-named modules are allowed only as one concept seen from two sides, which both docstrings say.

    The sides in this project: a verb's command-line module (``recsys_rl/cli``) and the module doing its
    work, and the registry's routing beside the server's.
    """
    modules = [
        path
        for folder in ("recsys_rl", "pipelines", "serving")
        for path in (REPO / folder).rglob("*.py")
        if path.name != "__init__.py" and not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    ]
    counts = Counter(path.name for path in modules)
    unexplained = []
    for path in modules:
        if counts[path.name] < 2:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        twins = [other for other in modules if other.name == path.name and other != path]
        if not any(_names_twin(doc, twin) for twin in twins):
            unexplained.append(str(path.relative_to(REPO)))
    assert unexplained == []


def _names_twin(docstring: str, twin: Path) -> bool:
    """Whether the docstring points at the twin module, by dotted name or by its command."""
    relative = twin.relative_to(REPO).with_suffix("")
    dotted = ".".join(relative.parts)
    installed = {"pipelines": "recsys_rl.pipelines", "serving": "recsys_rl.serving"}.get(relative.parts[0])
    if installed:
        dotted = installed + "." + ".".join(relative.parts[1:])
    short = ".".join(relative.parts[-2:])
    return any(name in docstring for name in (dotted, short))
