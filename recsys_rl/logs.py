"""Structured logging: one ``key=value`` line per event, tagged with the run id, on stderr.

stdout stays for a command's result (what it produced and where), so scripts can parse it while people
watch progress on stderr. On a terminal a job's counted loop shows as a progress bar instead of a line
per tick; elsewhere (a log file, a pipe) every line is a plain ``key=value`` line, without colour codes.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import logging
import os
import re
import sys
import sysconfig
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from tqdm import tqdm

Progress = Callable[[str, dict[str, Any]], None]

_CONFIGURED = False

#: ANSI escape sequences (colour, cursor moves): a log file keeps them as garbage.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")

#: A line longer than this is hard to read and to grep; its nested values give way to their sizes.
MAX_LINE = 300


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields.update(getattr(record, "kv", {}))
        return _bounded_line(fields)


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is at each record, not as it was when logging was configured.

    A command run in-process (tests, notebooks, ``contextlib.redirect_stderr``) swaps ``sys.stderr``;
    a handler holding the first stream would write to a closed or stale one instead.
    """

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr


def _quote(value: object) -> str:
    """A value as logfmt reads it: nested values as compact JSON (never a Python repr), and anything with
    a space, ``=`` or quote inside as a JSON string, so the line splits back into exactly its fields."""
    if isinstance(value, dict | list | tuple):
        text = json.dumps(value, default=str, separators=(",", ":"))
    else:
        text = str(value)
    text = _ANSI.sub("", text)  # a library's coloured message: the codes would be escaped, not rendered
    return json.dumps(text) if (" " in text or "=" in text or '"' in text or not text) else text


def _joined(fields: dict[str, object]) -> str:
    return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _bounded_line(fields: dict[str, object]) -> str:
    """The fields as one line; over MAX_LINE, its nested values, longest first, become ``KEY.items=N``.

    What makes a job's line long is a nested output (a Kafka plan's ranges, all final metrics): the job
    keeps it whole in a file it names (a run record, a manifest), and the line says only how big it is.
    """
    line = _joined(fields)
    nested = [k for k, v in fields.items() if isinstance(v, dict | list | tuple)]
    for key in sorted(nested, key=lambda k: len(_quote(fields[k])), reverse=True):
        sized = {(f"{k}.items" if k == key else k): (len(v) if k == key else v) for k, v in fields.items()}
        if len(line) <= MAX_LINE or len(_joined(sized)) >= len(line):  # short enough, or no shorter
            break
        fields, line = sized, _joined(sized)
    return line


#: Third-party log records that say nothing about a recsys-rl run, as (logger, text in the message):
#: Beam warns about BigQuery client libraries we never use on every import of apache_beam; kafka-python
#: times its own I/O loop and warns when a step of it is slow, which any busy machine makes it (its I/O
#: failures it reports as errors and exceptions of their own).
_THIRD_PARTY_NOISE = (
    ("root", "apitools not found, and bigquery client libraries"),
    ("kafka.net.selector", "It is blocking the event loop"),
)


def _not_third_party_noise(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:  # a failure is never noise, whoever reports it
        return True
    return not any(record.name == name and text in str(record.msg) for name, text in _THIRD_PARTY_NOISE)


#: The standard library's directories; installed libraries are under site-packages or dist-packages.
_STDLIB_DIRS = tuple({sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")})
_OUR_DIR = str(Path(__file__).parent)  # an installed recsys_rl is under site-packages too


def _library_deprecation(category: type[Warning], filename: str) -> bool:
    """A deprecation that library code (not ours) runs into: news for that library's authors.

    Python shows those only for code run as ``__main__``, but Feast's import turns them on for every
    module, so that TF-Agents' and TensorFlow Probability's use of distutils warned on every start.
    """
    library = filename.startswith(_STDLIB_DIRS) or not {"site-packages", "dist-packages"}.isdisjoint(
        Path(filename).parts
    )
    return issubclass(category, DeprecationWarning) and library and not filename.startswith(_OUR_DIR)


_PYTHON_SHOWWARNING = warnings.showwarning


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` for the command line: one key=value line per warning, and library
    deprecations not at all."""
    if file is not None:  # a caller that names a stream wants Python's own format there
        _PYTHON_SHOWWARNING(message, category, filename, lineno, file, line)
    elif not _library_deprecation(category, filename):
        logging.getLogger("py.warnings").warning(
            str(message), extra={"kv": {"category": category.__name__, "at": f"{filename}:{lineno}"}}
        )


#: TensorFlow's C++ start-up lines go to file descriptor 2, not through Python, and no setting stops
#: them all (TF_CPP_MIN_LOG_LEVEL covers TensorFlow's own logging, not Abseil's); Gym prints its
#: unmaintained notice at import. Whichever module imports these first, wherever, does so quietly.
_QUIET_IMPORTS = frozenset({"tensorflow", "gym"})


class _QuietFirstImports(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _QUIET_IMPORTS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self._loader  # it keeps the loader it came with
        with quiet_native_imports():
            self._loader.exec_module(module)
            if module.__name__ == "tensorflow":
                # TensorFlow probes for CUDA at its first use of a device, not at import, and reports
                # a machine without a GPU driver as an error: probe now, while that is held back.
                module.config.list_physical_devices()


def quiet_third_party_output() -> None:
    """The command line's stderr for its own lines: what libraries log becomes key=value lines too,
    less known noise (above); library deprecation warnings are dropped; TensorFlow and Gym import
    quietly. A failure, from a library or not, always shows.

    Logging that a caller set up before (a test harness running the command in-process, a second call)
    is left as it is."""
    root = logging.getLogger()
    if not root.handlers:
        handler = _CurrentStderrHandler()
        handler.setFormatter(KeyValueFormatter())
        handler.addFilter(_not_third_party_noise)
        # before any library's import can log: logging.warning() would otherwise install basicConfig's
        # handler, whose WARNING:name:message lines no log reader here parses
        root.addHandler(handler)
    warnings.showwarning = _log_warning
    if not any(isinstance(f, _QuietFirstImports) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFirstImports())


#: Abseil's and glog's format: severity letter, month and day; E for errors, F for fatal ones.
_NATIVE_ERROR = re.compile(r"[EF]\d{4} ")


def _native_errors(held: str) -> str:
    """The error lines of what was held back, less TensorFlow's failed CUDA start on a machine without a
    CUDA driver: TensorFlow says first that it found none, and runs on the CPU as it should."""
    no_driver = "Could not find cuda drivers on your machine" in held
    return "".join(
        line
        for line in held.splitlines(keepends=True)
        if _NATIVE_ERROR.match(line) and not (no_driver and "failed call to cuInit" in line)
    )


@contextlib.contextmanager
def quiet_native_imports() -> Iterator[None]:
    """Hold back what imports write straight to file descriptor 2: all of it if they fail, else only the
    errors among native log lines.

    Importing TensorFlow and TF-Agents prints a dozen start-up lines from C++ (oneDNN, CUDA probing,
    which TF_CPP_MIN_LOG_LEVEL does not silence) and Gym's deprecation notice; before every command's
    own output, they would bury its one-line result or error.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            held.seek(0)
            output = held.read()
            os.write(saved, output if failed else _native_errors(output.decode(errors="replace")).encode())
            os.close(saved)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def get_logger(name: str) -> logging.Logger:
    """A logger under ``recsys_rl`` that writes key=value lines to stderr (configured once)."""
    global _CONFIGURED
    root = logging.getLogger("recsys_rl")
    if not _CONFIGURED:
        handler = _CurrentStderrHandler()
        handler.setFormatter(KeyValueFormatter())
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
        _CONFIGURED = True
    return root.getChild(name)


def log_event(logger: logging.Logger, event: str, **kv: object) -> None:
    logger.info(event, extra={"kv": kv})


class _PrintedLines(io.TextIOBase):
    """A text stream that logs each line printed to it as an event (blank lines dropped)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._partial = ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            self._log(line)
        return len(text)

    def close(self) -> None:
        self._log(self._partial)
        self._partial = ""
        super().close()

    def _log(self, line: str) -> None:
        if line.strip():
            log_event(self._logger, "printed", text=line.strip())


@contextlib.contextmanager
def prints_to_stderr(name: str) -> Iterator[None]:
    """What a library prints to stdout goes to stderr instead, stdout being for a command's result: as
    printed on a terminal; elsewhere each line as a key=value event of logger ``name``, where the colour
    codes and blank lines that libraries (Feast) print would be noise in a log file."""
    if sys.stderr.isatty():
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    with contextlib.closing(_PrintedLines(get_logger(name))) as lines, contextlib.redirect_stdout(lines):
        yield


#: The progress event of a counted loop (training's): it reports ``step`` done of ``of``.
TICK = "step"


class _Bar:
    """A tqdm bar over a job's ``step`` of ``of``, on stderr while that is a terminal."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._bar: tqdm | None = None

    @staticmethod
    def wanted(fields: dict[str, Any]) -> bool:
        return "step" in fields and "of" in fields and sys.stderr.isatty()

    def move(self, fields: dict[str, Any], postfix: dict[str, Any]) -> None:
        step, total = fields["step"], fields["of"]
        if self._bar is None or self._bar.total != total:
            self.close()
            self._bar = tqdm(total=total, initial=step, desc=self._name, unit="step", file=sys.stderr)
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(step - self._bar.n)
        if step >= total:
            self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def aside(self) -> contextlib.AbstractContextManager:
        """Room for a line while the bar is up: tqdm clears it and draws it again below."""
        return (
            tqdm.external_write_mode(file=sys.stderr) if self._bar is not None else contextlib.nullcontext()
        )


def _headline(fields: dict[str, Any]) -> dict[str, Any]:
    """A tick's first figure after ``step`` and ``of`` (training's loss): more would squeeze the bar out."""
    return dict([(k, v) for k, v in fields.items() if k not in ("step", "of")][:1])


def progress_logger(name: str) -> Progress:
    """A job's progress callback: each (event, fields) becomes one key=value line with a fresh run id.

    While stderr is a terminal, the ticks of a counted loop (``step`` events) move a progress bar with
    an ETA instead of writing a line each, and the event that starts the loop (it has ``step`` and
    ``of`` too) puts the bar up; everywhere else, the lines are all there is, for log readers and tests.
    """
    logger = get_logger(name)
    run_id = new_run_id()
    bar = _Bar(name)

    def progress(event: str, fields: dict[str, Any]) -> None:
        counted = _Bar.wanted(fields)
        if not (counted and event == TICK):
            with bar.aside():
                log_event(logger, event, run_id=run_id, **fields)
        if counted:
            bar.move(fields, _headline(fields) if event == TICK else {})

    return progress
