"""A local Apache Flink to run the Beam pipelines on: Beam's Flink job server and a Python worker pool.

`LocalFlink` starts two processes on free loopback ports and stops them again:

* the job server, ``org.apache.beam.runners.flink.FlinkJobServerDriver`` from the jars that `make
  flink-jars` copies into ``~/.cache/recsys-rl`` (``tests/flink/pom.xml``), with ``--flink-master
  [local]``: the Flink 1.19 cluster runs inside the job server's JVM, so nothing else needs installing;
* a Beam worker pool (``python -m apache_beam.runners.worker.worker_pool_main``) that the job server
  asks for SDK workers (``--environment_type=EXTERNAL``). The pool starts each worker as a bare
  ``python`` looked up on its PATH, so it runs with the virtual environment's ``bin`` first on PATH and
  VIRTUAL_ENV set; a pool started without them launches the system Python, whose workers die on
  ``import apache_beam`` while the job waits for them for minutes instead of failing. So `start` first
  runs that same ``python`` with the pool's environment and fails at once, with one line, unless it
  imports ``recsys_rl`` and the Beam version this process submits with.

`pipeline_args` gives the Beam flags that send a pipeline there (PortableRunner, the job endpoint, the
EXTERNAL environment, the parallelism). With `process_environment` instead, each worker is Beam's boot
program (what the SDK container runs; `make beam-boot` builds it from the pinned Beam release's Go
module), which installs the job's staged files, the project's sdist from ``--setup_file`` included,
into the given Python environment before it starts the worker: how a cluster whose workers do not
have the project gets it. The job server is Beam 2.62.0 while the Python SDK is the
pinned 2.77: Maven Central has no 2.77 Flink job server to fetch (README.md, "Other runners", and
``tests/flink/pom.xml`` say why); the portable job API is what the two versions share, and the Flink
integration test checks that the pairing writes byte for byte the dataset the in-process runner writes.

Addresses are loopback ones, but the job, artifact and worker-pool services listen on all interfaces
(``--job-host`` only sets the address the job server advertises, and the pool binds ``[::]``): run
this on a machine whose firewall keeps those ports private. The Flink REST endpoint is bound to
loopback by the generated Flink configuration.

A job submitted here has no deadline of its own: whoever runs one (a test, a benchmark) bounds it, e.g.
by running ``recsys-rl build-transitions`` as a subprocess with a timeout; `stop` ends whatever still
runs.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import apache_beam

from recsys_rl.kafka.broker import free_port, log_excerpt
from recsys_rl.processes import stop_process

#: The Beam release of the job server jars (`make flink-jars`), and the Flink it embeds.
BEAM_FLINK_VERSION = "2.62.0"
FLINK_VERSION = "1.19"
FLINK_LIBS_ENV = "RECSYS_RL_FLINK_LIBS"
DEFAULT_FLINK_LIBS = (
    Path.home() / ".cache" / "recsys-rl" / f"beam-flink-{FLINK_VERSION}-{BEAM_FLINK_VERSION}" / "libs"
)
JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
#: Beam's SDK worker entrypoint (``sdks/python/container/boot.go``) of the pinned Beam release, built by
#: `make beam-boot` from the Go module proxy: what a PROCESS environment starts for each worker.
BEAM_BOOT_ENV = "RECSYS_RL_BEAM_BOOT"
DEFAULT_BEAM_BOOT = Path.home() / ".cache" / "recsys-rl" / f"beam-boot-{apache_beam.__version__}" / "boot"

_LOOPBACK = "127.0.0.1"
_JOB_SERVER_LOG = "job-server.log"
_WORKER_POOL_LOG = "worker-pool.log"
# What a worker needs to run our pipelines: the package (its DoFns are pickled by reference), and the
# Beam release and Python minor version the submitting process pickled them with.
_WORKER_CHECK = (
    "import sys, apache_beam, recsys_rl; "
    "print(apache_beam.__version__, '%d.%d' % sys.version_info[:2], sys.executable)"
)
# The local cluster's scratch space (spilled data, blob cache, uploads) goes under the service's own
# directory rather than /tmp, so a stop removes it and two instances never share it.
_FLINK_CONF = """\
io.tmp.dirs: {tmp}
web.upload.dir: {tmp}
rest.address: 127.0.0.1
rest.bind-address: 127.0.0.1
"""


class FlinkSetupError(RuntimeError):
    """The job server or the worker pool could not start, or the workers would not work; one line."""


class LocalFlink:
    """Beam's Flink job server (an in-JVM Flink cluster) and a Python worker pool, on loopback ports.

    ``start()`` returns once both accept connections and the pool's ``python`` has been checked;
    ``stop()`` ends both (the pool's SDK workers too) and may be called any number of times. Logs are
    ``job-server.log`` and ``worker-pool.log`` in ``workdir`` (a temporary directory, removed on stop,
    unless one is given).
    """

    def __init__(
        self,
        workdir: str | os.PathLike[str] | None = None,
        *,
        libs_dir: str | os.PathLike[str] | None = None,
        python: str | os.PathLike[str] | None = None,
        heap_mb: int = 1024,
        ready_timeout_s: float = 90.0,
        stop_grace_s: float = 15.0,
    ) -> None:
        self.libs_dir = Path(libs_dir) if libs_dir is not None else default_flink_libs()
        # not resolved: a venv's bin/python is a symlink to the base interpreter, and only the link's
        # location says which environment (site-packages) it runs with
        self.python = Path(python) if python is not None else Path(sys.executable)
        self._given_workdir = Path(workdir) if workdir is not None else None
        self._heap_mb = heap_mb
        self._ready_timeout_s = ready_timeout_s
        self._stop_grace_s = stop_grace_s
        self._workdir: Path | None = None
        self._job_server: subprocess.Popen[bytes] | None = None
        self._worker_pool: subprocess.Popen[bytes] | None = None
        self._job_port: int | None = None
        self._pool_port: int | None = None

    @property
    def job_endpoint(self) -> str:
        """The job service's address, for ``--job_endpoint``."""
        if self._job_port is None:
            raise FlinkSetupError("LocalFlink has no job endpoint yet: call start() first")
        return f"{_LOOPBACK}:{self._job_port}"

    @property
    def worker_pool_address(self) -> str:
        """The worker pool's address, for ``--environment_config`` with the EXTERNAL environment."""
        if self._pool_port is None:
            raise FlinkSetupError("LocalFlink has no worker pool yet: call start() first")
        return f"{_LOOPBACK}:{self._pool_port}"

    @property
    def job_server_log(self) -> Path:
        if self._workdir is None:
            raise FlinkSetupError("LocalFlink has no log yet: call start() first")
        return self._workdir / _JOB_SERVER_LOG

    def pipeline_args(
        self, parallelism: int = 2, *, worker_cache_s: float = 60.0, environment: Sequence[str] = ()
    ) -> list[str]:
        """The Beam flags that run a pipeline on this Flink, with this worker pool unless ``environment``
        gives other environment flags (`process_environment`).

        ``--sdk_worker_parallelism`` starts as many Python workers as Flink runs subtasks, so the Python
        code runs in parallel too (one worker process would serialise it under the GIL). A PROCESS
        environment gets one: each of its workers is a boot program that pip-installs the staged files
        into the same Python environment, and two installing at once break each other's install.
        ``--environment_cache_millis`` keeps a job's workers between its stages: without it each stage
        starts fresh ones, and every start imports Beam and the package again (build-transitions on 60
        simulated users started 7 workers and took 55-80 s on two busy cores; 2 workers, about 30 s).
        """
        if not environment:
            environment = ["--environment_type=EXTERNAL", f"--environment_config={self.worker_pool_address}"]
        return [
            "--runner=PortableRunner",
            f"--job_endpoint={self.job_endpoint}",
            *environment,
            f"--parallelism={parallelism}",
            f"--sdk_worker_parallelism={1 if '--environment_type=PROCESS' in environment else parallelism}",
            f"--environment_cache_millis={round(worker_cache_s * 1000)}",
        ]

    def start(self) -> Self:
        if self._job_server is not None:
            return self
        try:
            self._launch()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in (self._worker_pool, self._job_server):
            if process is not None:
                # the group: the pool's SDK workers and the JVM's children must not outlive them
                stop_process(process, self._stop_grace_s, group=True)
        self._worker_pool = self._job_server = None
        self._job_port = self._pool_port = None
        if self._workdir is not None and self._given_workdir is None:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._workdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        running = self._job_server is not None
        return f"LocalFlink(job_endpoint={self._job_port and self.job_endpoint!r}, running={running})"

    def _launch(self) -> None:
        classpath = flink_classpath(self.libs_dir)
        java = _java_binary()
        if not os.access(self.python, os.X_OK):
            raise FlinkSetupError(f"the worker pool's interpreter {self.python} is not an executable file")
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self._workdir = self._given_workdir
        else:
            self._workdir = Path(tempfile.mkdtemp(prefix="recsys-rl-flink-"))
        workdir = self._workdir
        conf_dir, scratch = workdir / "flink-conf", workdir / "flink-tmp"
        conf_dir.mkdir(exist_ok=True)
        scratch.mkdir(exist_ok=True)
        (conf_dir / "flink-conf.yaml").write_text(_FLINK_CONF.format(tmp=scratch))

        self._job_port = free_port()
        argv = [
            java,
            f"-Xmx{self._heap_mb}m",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            "-cp",
            classpath,
            JOB_SERVER_MAIN,
            # args4j options: each value a separate argument
            *("--job-host", _LOOPBACK),
            *("--job-port", str(self._job_port)),
            *("--artifact-port", str(free_port())),
            # no Java expansion service: the pipelines use no cross-language transform
            *("--expansion-port", "-1"),
            *("--flink-master", "[local]"),  # a Flink mini-cluster in this JVM
            *("--flink-conf-dir", str(conf_dir)),
            *("--artifacts-dir", str(workdir / "artifacts")),
        ]
        self._job_server = _spawn(argv, workdir, workdir / _JOB_SERVER_LOG, os.environ.copy())
        # the check runs while the JVM starts, and fails before anything waits on the pool
        env = worker_environment(self.python)
        check_worker_python(env, workdir)
        self._pool_port = free_port()
        pool_argv = [
            str(self.python),
            "-m",
            "apache_beam.runners.worker.worker_pool_main",
            f"--service_port={self._pool_port}",
        ]
        self._worker_pool = _spawn(pool_argv, workdir, workdir / _WORKER_POOL_LOG, env)
        deadline = time.monotonic() + self._ready_timeout_s
        _wait_for_port(self._job_server, self._job_port, workdir / _JOB_SERVER_LOG, "job server", deadline)
        _wait_for_port(
            self._worker_pool, self._pool_port, workdir / _WORKER_POOL_LOG, "worker pool", deadline
        )


def default_flink_libs() -> Path:
    configured = os.environ.get(FLINK_LIBS_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_FLINK_LIBS


def flink_classpath(libs_dir: Path) -> str:
    """The JVM classpath for the jars in ``libs_dir``, or a `FlinkSetupError` saying how to fetch them."""
    if not any(libs_dir.glob(f"beam-runners-flink-{FLINK_VERSION}-*.jar")):
        raise FlinkSetupError(
            f"Beam {BEAM_FLINK_VERSION} Flink {FLINK_VERSION} job server jars not found in {libs_dir}: "
            f"run `make flink-jars` (or point {FLINK_LIBS_ENV} at a directory holding them)"
        )
    return str(libs_dir / "*")


def default_beam_boot() -> Path:
    configured = os.environ.get(BEAM_BOOT_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_BEAM_BOOT


def process_environment(python: Path, scratch_dir: Path, boot: Path | None = None) -> list[str]:
    """The Beam flags of a PROCESS environment whose workers are Beam's boot program running ``python``.

    Boot fetches the job's staged files from the job server, pip-installs the packages among them (the
    sdist that ``--setup_file`` builds of the project) into ``python``'s environment, then starts the
    SDK worker with that ``python``: the environment needs the dependencies, not the project. It runs
    with RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT set: otherwise it installs into a new virtualenv under
    /opt/apache made with --system-site-packages, which sees the base interpreter's packages rather
    than the environment's. ``python`` must be that environment's ``bin/python`` (not resolved: only
    the link's location says which site-packages it runs with).

    The job server starts boot with only its worker id and provision endpoint, so boot would stage the
    files in ``/tmp/staged``, shared by every job on the machine; the command is therefore a script in
    ``scratch_dir`` that hands boot a ``--semi_persist_dir`` of its own there.
    """
    boot = boot if boot is not None else default_beam_boot()
    if not os.access(boot, os.X_OK):
        raise FlinkSetupError(
            f"Beam's boot program for Beam {apache_beam.__version__} is not at {boot}: run `make beam-boot` "
            f"(or point {BEAM_BOOT_ENV} at one)"
        )
    scratch_dir.mkdir(parents=True, exist_ok=True)
    command = scratch_dir / "boot"
    persist = scratch_dir / "worker-files"
    command.write_text(
        f'#!/bin/sh\nexec {shlex.quote(str(boot))} --semi_persist_dir={shlex.quote(str(persist))} "$@"\n'
    )
    command.chmod(0o755)
    env = worker_environment(python)
    config = {
        "command": str(command),
        "env": {
            "PATH": env["PATH"],
            **({"VIRTUAL_ENV": env["VIRTUAL_ENV"]} if "VIRTUAL_ENV" in env else {}),
            "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT": "1",
        },
    }
    return ["--environment_type=PROCESS", f"--environment_config={json.dumps(config)}"]


def worker_environment(python: Path) -> dict[str, str]:
    """This process's environment with ``python``'s directory first on PATH, and VIRTUAL_ENV set when
    that directory is a virtual environment's ``bin``: the pool starts its workers as a bare ``python``."""
    env = os.environ.copy()
    bin_dir = python.absolute().parent
    env["PATH"] = os.pathsep.join([str(bin_dir), *(p for p in env.get("PATH", "").split(os.pathsep) if p)])
    if (bin_dir.parent / "pyvenv.cfg").is_file():
        env["VIRTUAL_ENV"] = str(bin_dir.parent)
    else:  # not one: an inherited VIRTUAL_ENV would name an environment the workers do not run in
        env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONHOME", None)
    return env


def check_worker_python(env: dict[str, str], cwd: Path, timeout_s: float = 60.0) -> None:
    """Run the ``python`` the worker pool will start with ``env``, exactly as the pool does, and raise a
    `FlinkSetupError` unless it imports ``recsys_rl`` and runs this process's Beam and Python versions."""
    found = shutil.which("python", path=env.get("PATH"))
    if found is None:
        raise FlinkSetupError(
            f"no `python` on the worker pool's PATH ({env.get('PATH')}): its workers cannot start"
        )
    try:
        result = subprocess.run(
            ["python", "-c", _WORKER_CHECK],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise FlinkSetupError(
            f"the worker pool's python ({found}) did not import recsys_rl within {timeout_s:g} s"
        ) from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise FlinkSetupError(
            f"the worker pool's python ({found}) cannot run the pipeline's workers: {last} "
            "(start the pool with the project's virtual environment first on PATH)"
        )
    beam_version, python_version, executable = result.stdout.strip().splitlines()[-1].split(maxsplit=2)
    expected = (apache_beam.__version__, f"{sys.version_info.major}.{sys.version_info.minor}")
    if (beam_version, python_version) != expected:
        raise FlinkSetupError(
            f"the worker pool's python ({executable.strip()}) runs Beam {beam_version} on Python "
            f"{python_version}, but pipelines are submitted with Beam {expected[0]} on Python {expected[1]}"
        )


def _java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(Path(java_home, "bin", "java"), os.X_OK):
        return str(Path(java_home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise FlinkSetupError(
            "the Flink job server needs a Java 17 runtime and none was found: set JAVA_HOME or install one"
        )
    return found


def _spawn(argv: list[str], cwd: Path, log_path: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, so that stop() can end its children too
        )


def _wait_for_port(
    process: subprocess.Popen[bytes], port: int, log_path: Path, what: str, deadline: float
) -> None:
    while True:
        if process.poll() is not None:
            raise FlinkSetupError(
                f"the Flink {what} exited with code {process.returncode}: {log_excerpt(log_path)}"
            )
        try:
            with socket.create_connection((_LOOPBACK, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise FlinkSetupError(
                f"the Flink {what} did not listen on {_LOOPBACK}:{port} in time: {log_excerpt(log_path)}"
            )
        time.sleep(0.1)
