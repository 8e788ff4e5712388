"""Mutation testing of the core modules with mutmut: a score per module and the mutants no test kills.

Each module in ``[tool.mutation.modules]`` of pyproject.toml is mutated on its own, against only the fast
unit test files listed for it there; mutmut then runs, for each mutant, only those of the listed tests
that call the mutated function (it records which do in a first, clean run). A mutant is *killed* when a
test fails, *survived* when all pass, *timeout* when the tests run past mutmut's limit (the covering
tests' time plus ``timeout_constant``, times ``timeout_multiplier``), and *no tests* when no listed test
calls the function at all. ``score`` is (killed + timeout) / total: no-tests mutants count against it,
since nothing would notice them.

A survivor no test should kill (an equivalent mutant, or a change only a benchmark would see) is listed in
``bench/mutation_accepted.toml`` under its module and id, with the mutation it makes and the reason; the
result then carries that reason beside it. An entry whose mutation no longer matches the survivor (the
function changed and mutmut renumbered its mutants) is not applied, and every survivor without a reason
counts in ``unexplained``.

mutmut names a mutant by its file's path, and the tests import ``recsys_rl.pipelines`` and
``recsys_rl.serving`` from pipelines/ and serving/ (setup.py's package_dir), so each run stages the
installed layout under ``.mutation/<module>/`` (a copy of the working tree, which is never mutated in
place) and runs ``mutmut run`` there. The result merges into ``--out``: modules not run this time keep
their earlier entry, each with its own commit and wall time, and their survivors' reasons are read again
from the accepted list as it is now.

    python bench/mutation.py                                    # every configured module
    python bench/mutation.py --modules recsys_rl/ope/gate.py serving/routing.py
    python bench/mutation.py --modules serving/routing.py --fail-under 0.8   # exit 1 below 80%
    python bench/mutation.py --explain-only        # after editing bench/mutation_accepted.toml
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from difflib import SequenceMatcher
from importlib import metadata
from pathlib import Path
from typing import Any

from common import git_commit, write_result

from recsys_rl.processes import exit_on_sigterm

ROOT = Path(__file__).resolve().parents[1]
ACCEPTED = Path(__file__).resolve().with_name("mutation_accepted.toml")
#: where each top-level source folder sits in the installed layout (setup.py's package_dir)
PACKAGE_DIRS = {
    "recsys_rl": "recsys_rl",
    "pipelines": "recsys_rl/pipelines",
    "serving": "recsys_rl/serving",
    "features": "recsys_rl/feature_repo",
}
#: never staged: built, cached or data files, and the tests that need services, Node.js or the network
SKIP_NAMES = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", "data", "node_modules")
SKIP_TEST_DIRS = ("integration", "kafka", "node")
#: mutmut's exit codes (mutmut.stats.status_by_exit_code) folded into the result's counts
STATUS_KEYS = {
    "killed": "killed",
    "caught by type check": "killed",
    "survived": "survived",
    "timeout": "timeout",
    "no tests": "no_tests",
    "not checked": "not_checked",
    "skipped": "skipped",
}
#: the outcomes of mutants mutmut tested (not those it skipped or did not get to); "other" is any new one
TESTED = ("killed", "survived", "timeout", "no_tests", "other")
DIFF_CHARS = 200
CONTEXT = 20  # characters of unchanged code either side of a change in a mutant's summary


def load_config(pyproject: Path) -> dict[str, Any]:
    """``[tool.mutation]``: mutmut's settings and the module-to-test-files map."""
    config = tomllib.loads(pyproject.read_text())["tool"]["mutation"]
    return {
        "mutmut": config.get("mutmut", {}),
        "modules": config["modules"],
        "module_settings": config.get("module_settings", {}),
    }


def staged_path(module: str) -> str:
    """``pipelines/episodes.py`` -> ``recsys_rl/pipelines/episodes.py``: the path mutmut sees."""
    top, _, rest = module.partition("/")
    if top not in PACKAGE_DIRS:
        raise SystemExit(f"--modules: {module!r} is not under one of {sorted(PACKAGE_DIRS)}")
    return f"{PACKAGE_DIRS[top]}/{rest}"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def write_pyproject(path: Path, tables: dict[str, dict[str, Any]]) -> None:
    lines = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in table.items())
        lines.append("")
    path.write_text("\n".join(lines))


def stage(module: str, tests: list[str], settings: dict[str, Any], work: Path) -> Path:
    """A fresh copy of the source in the installed layout, the unit tests and mutmut's config."""
    directory = work / module.replace("/", "__").removesuffix(".py")
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for top, target in PACKAGE_DIRS.items():
        shutil.copytree(ROOT / top, directory / target, ignore=SKIP_NAMES)
    shutil.copytree(
        ROOT / "tests", directory / "tests", ignore=shutil.ignore_patterns(*SKIP_TEST_DIRS, "__pycache__")
    )
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    mutmut = {
        **settings,
        "source_paths": ["recsys_rl"],
        "only_mutate": [staged_path(module)],
        "pytest_add_cli_args_test_selection": tests,
    }
    write_pyproject(
        directory / "pyproject.toml", {"tool.pytest.ini_options": pytest_options, "tool.mutmut": mutmut}
    )
    return directory


def run_mutmut(directory: Path, jobs: int, timeout_s: float) -> tuple[int | None, float]:
    """``mutmut run`` in ``directory``, its output in mutmut.log; the exit code is None on timeout."""
    start = time.perf_counter()
    with open(directory / "mutmut.log", "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
            cwd=directory,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so a timeout ends its workers too
        )
        try:
            code: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(process)
            code = None
        except BaseException:  # Ctrl-C or SIGTERM (see main): take mutmut's workers down too
            _stop_group(process)
            raise
    return code, time.perf_counter() - start


#: Collects the tests as mutmut's fork server does, then runs a layer normalisation (the agents' networks
#: use it) in a forked child: it hangs where collecting started TensorFlow's runtime (a tensor made when a
#: test module is imported), and so would every mutant's worker, each hang a timeout counted as killed.
FORK_PROBE = """
import os, sys, time
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # as recsys_rl sets it
import pytest
collected = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]])
if collected != 0:
    sys.exit(f"pytest exited {int(collected)}")
if "tensorflow" not in sys.modules:
    sys.exit(0)
import tensorflow as tf
child = os.fork()
if child == 0:
    tf.keras.layers.LayerNormalization()(tf.ones((4, 3)))
    os._exit(0)
deadline = time.monotonic() + float(os.environ["FORK_PROBE_TIMEOUT_S"])
while time.monotonic() < deadline:
    if os.waitpid(child, os.WNOHANG)[0]:
        sys.exit(0)
    time.sleep(0.2)
os.kill(child, 9)
sys.exit(3)
"""


def fork_hang(directory: Path, tests: list[str], timeout_s: float = 60.0) -> str | None:
    """Why mutmut's forked workers would hang on ``tests``, or None when a child forked after collecting
    them runs TensorFlow (or the tests do not import it)."""
    probe = subprocess.run(
        [sys.executable, "-c", FORK_PROBE, *tests],
        cwd=directory,
        env={**os.environ, "FORK_PROBE_TIMEOUT_S": str(timeout_s)},
        capture_output=True,
        text=True,
    )
    if probe.returncode == 0:
        return None
    if probe.returncode == 3:
        return (
            f"a process forked after collecting {tests} hangs in TensorFlow (a tensor made when a test "
            "module is imported starts its runtime), so every mutant's worker would time out and count as "
            "killed: make such tensors inside the tests"
        )
    return f"collecting {tests} failed ({probe.returncode}): {probe.stdout[-500:]}{probe.stderr[-500:]}"


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def function_lines(source: str) -> dict[tuple[str | None, str], int]:
    """(class name or None, function name) -> the line of its ``def``, for top-level functions and methods."""
    lines = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines[(None, node.name)] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines[(node.name, item.name)] = item.lineno
    return lines


def describe(original: str, mutant: str, def_line: int | None) -> dict[str, Any]:
    """The file line of the first changed line of a function and a one-line summary of the change.

    ``original`` and ``mutant`` are the function's text as mutmut renders it (comments above it, then
    its ``def``), so a position in them is an offset from the ``def`` line in the file.
    """
    old, new = original.splitlines(), mutant.splitlines()
    opcodes = [op for op in SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not opcodes:
        return {"line": def_line, "mutation": "(no textual change)"}
    _, i1, i2, j1, j2 = opcodes[0]
    def_index = next((i for i, text in enumerate(old) if text.startswith(("def ", "async def "))), 0)
    line = def_line + i1 - def_index if def_line is not None else None
    removed = " / ".join(text.strip() for text in old[i1:i2])
    added = " / ".join(text.strip() for text in new[j1:j2])
    return {"line": line, "mutation": summarise(removed, added)}


def function_texts(name: str, path: str) -> tuple[str, str]:
    """The unmutated and the mutated text of the function that mutant ``name`` changes (mutmut's own)."""
    import libcst as cst
    from mutmut.mutation import diff_apply

    functions = diff_apply.read_functions_from_index(name, path)
    if functions is None:
        module = diff_apply.read_mutants_module(path)
        functions = (
            diff_apply.read_original_function(module, name),
            diff_apply.read_mutant_function(module, name),
        )
    original, mutant = (cst.Module([function]).code.strip() for function in functions)
    return original, mutant


def summarise(old: str, new: str) -> str:
    """``old -> new`` cut to the part that changed, with ``CONTEXT`` characters either side."""
    prefix = 0
    while prefix < min(len(old), len(new)) and old[prefix] == new[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(old), len(new)) - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    start = max(prefix - CONTEXT, 0)

    def cut(text: str) -> str:
        end = min(len(text) - suffix + CONTEXT, len(text))
        return ("…" if start else "") + text[start:end] + ("…" if end < len(text) else "")

    return f"{cut(old)} -> {cut(new)}"[:DIFF_CHARS]


def collect(directory: Path, module: str) -> dict[str, Any]:
    """Counts and surviving mutants from mutmut's metadata in ``directory/mutants``."""
    from mutmut import configuration
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    path = staged_path(module)
    meta_file = directory / "mutants" / f"{path}.meta"
    if not meta_file.exists():
        return {"total": 0}
    exit_codes = json.loads(meta_file.read_text())["exit_code_by_key"]
    counts = {key: 0 for key in ("killed", "survived", "timeout", "no_tests")}
    surviving = []
    def_lines = function_lines((directory / path).read_text())  # the staged copy: the tree moves on
    cwd = Path.cwd()
    os.chdir(directory)  # mutmut reads its config and mutants/ from the working directory
    configuration.reset_config()
    try:
        for name, code in sorted(exit_codes.items(), key=lambda item: _mutant_order(item[0])):
            status = STATUS_KEYS.get(status_by_exit_code[code], "other")
            counts[status] = counts.get(status, 0) + 1
            if status not in ("survived", "no_tests"):
                continue
            function, cls = orig_function_and_class_names_from_key(name)
            try:
                change = describe(*function_texts(name, path), def_lines.get((cls, function)))
            except Exception as err:  # the change is a convenience: report the mutant without it
                change = {"line": None, "mutation": f"(not read back: {type(err).__name__})"}
            entry = {
                "id": name.rpartition(".")[2],
                "function": f"{cls}.{function}" if cls else function,
                "status": status.replace("_", " "),
                **change,
            }
            surviving.append(entry)
    finally:
        os.chdir(cwd)
        configuration.reset_config()
    source = (directory / path).read_bytes()
    return {
        # the git blob id of the text mutated (line numbers refer to it): `git log --find-object=<id>`
        "source_blob": hashlib.sha1(b"blob %d\0" % len(source) + source).hexdigest(),
        **counts,
        "total": sum(counts.values()),
        "score": score(counts),
        "surviving": sorted(surviving, key=lambda s: (s["line"] or 0, s["id"])),
    }


def explain(result: dict[str, Any], accepted: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The result with each accepted survivor's reason beside it and the count of those without one."""
    unexplained = 0
    for mutant in result.get("surviving", []):
        mutant.pop("reason", None)  # an earlier run's, which the accepted list may have dropped since
        entry = accepted.get(mutant["id"])
        if entry is not None and entry["mutation"] == mutant["mutation"]:
            mutant["reason"] = entry["reason"]
        else:
            unexplained += 1
    return {**result, "unexplained": unexplained}


def _mutant_order(name: str) -> tuple[str, int]:
    base, _, number = name.rpartition("__mutmut_")
    return base, int(number) if number.isdigit() else 0


def dirty(paths: list[str]) -> bool:
    """Whether any of ``paths`` differs from the commit (others edit this tree while mutation runs)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return True
    return bool(out.stdout.strip())


def log_tail(directory: Path, lines: int = 15) -> str:
    text = (directory / "mutmut.log").read_text(errors="replace").replace("\r", "\n")
    return "\n".join(line for line in text.splitlines() if line.strip())[-lines * 200 :]


def score(counts: dict[str, int]) -> float | None:
    """(killed + timeout) / the mutants mutmut got to; None when it got to none (a failed or cut run)."""
    checked = sum(counts.get(status, 0) for status in TESTED)
    return round((counts["killed"] + counts["timeout"]) / checked, 4) if checked else None


def overall(modules: dict[str, dict[str, Any]]) -> dict[str, Any]:
    keys = ("killed", "survived", "timeout", "no_tests", "not_checked", "total", "unexplained")
    sums = {key: sum(m.get(key, 0) for m in modules.values()) for key in keys}
    return {
        **sums,
        "score": score(sums),
        "wall_s": round(sum(m.get("wall_s", 0.0) for m in modules.values()), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--modules", nargs="*", help="module paths from [tool.mutation.modules] (default: all)"
    )
    parser.add_argument("--out", default="bench/results/mutation.json")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (mutmut --max-children)")
    parser.add_argument("--module-timeout", type=float, default=1800, help="seconds per module, then stop")
    parser.add_argument("--work", default=str(ROOT / ".mutation"), help="staging folder (git-ignored)")
    parser.add_argument("--keep", action="store_true", help="keep each module's staging folder")
    parser.add_argument("--fail-under", type=float, help="exit 1 when a module run scores below this")
    parser.add_argument(
        "--explain-only",
        action="store_true",
        help=f"run nothing: read {ACCEPTED.name} again into --out's survivors (after editing it)",
    )
    args = parser.parse_args(argv)

    config = load_config(ROOT / "pyproject.toml")
    accepted = tomllib.loads(ACCEPTED.read_text()) if ACCEPTED.exists() else {}
    modules = [] if args.explain_only else args.modules or list(config["modules"])
    unknown = [m for m in modules if m not in config["modules"]]
    if unknown:
        parser.error(f"not in [tool.mutation.modules]: {unknown}; known: {list(config['modules'])}")

    exit_on_sigterm()
    out = Path(args.out)
    previous = json.loads(out.read_text()).get("modules", {}) if out.exists() else {}
    # modules not run this time keep their survivors, explained by the accepted list as it is now
    results = {module: explain(entry, accepted.get(module, {})) for module, entry in previous.items()}
    commit = git_commit()
    failed = []
    for module in modules:
        tests = [t for t in config["modules"][module] if (ROOT / t).exists()]
        missing = sorted(set(config["modules"][module]) - set(tests))
        if missing:
            print(f"{module}: skipping missing test files {missing}", file=sys.stderr)
        print(f"{module}: mutating against {len(tests)} test files", flush=True)
        settings = {**config["mutmut"], **config["module_settings"].get(module, {})}
        directory = stage(module, tests, settings, Path(args.work))
        hang = fork_hang(directory, tests) if settings.get("process_isolation") == "forkserver" else None
        if hang:
            failed.append(module)
            print(f"{module}: not run: {hang}", file=sys.stderr)
            if not args.keep:
                shutil.rmtree(directory, ignore_errors=True)
            continue
        code, wall = run_mutmut(directory, args.jobs, args.module_timeout)
        result = {
            "commit": commit,
            "dirty": dirty([module, *tests]),
            "tests": tests,
            "wall_s": round(wall, 1),
            **explain(collect(directory, module), accepted.get(module, {})),
        }
        if code is None:
            result["error"] = f"stopped after --module-timeout {args.module_timeout:.0f} s"
        elif code != 0:
            result["error"] = f"mutmut exited {code}: {log_tail(directory)}"
        if (
            args.fail_under is not None
            and "error" not in result
            and (result["score"] or 0.0) < args.fail_under
        ):
            result["error"] = f"score {result['score']} is under --fail-under {args.fail_under}"
        if "error" in result:
            failed.append(module)
            print(f"{module}: {result['error']}", file=sys.stderr)
        print(
            f"{module}: score {result.get('score')} (killed {result.get('killed', 0)}, survived "
            f"{result.get('survived', 0)}, timeout {result.get('timeout', 0)}, no tests "
            f"{result.get('no_tests', 0)} of {result['total']}; {result.get('unexplained', 0)} survivors "
            f"without a reason in {ACCEPTED.name}) in {wall:.0f} s",
            flush=True,
        )
        results[module] = result
        interrupted = code is not None and code < 0  # mutmut killed by a signal from outside: stop here
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
        _write(out, config, results)
        if interrupted:
            break
    if args.explain_only:
        _write(out, config, results)
    return 1 if failed else 0


def _write(out: Path, config: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    write_result(
        out,
        {
            "tool": {"name": "mutmut", "version": metadata.version("mutmut")},
            "config": config["mutmut"],
            "modules": results,
            "overall": overall(results),
        },
    )


if __name__ == "__main__":
    sys.exit(main())
