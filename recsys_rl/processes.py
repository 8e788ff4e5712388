"""Stopping the child processes we start (brokers, Redis, the demo's server): politely, then for sure; and
being stopped: a SIGTERM that unwinds, so that what we started stops with us."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

KILL_WAIT_S = 10.0


def stop_process(process: subprocess.Popen, grace_s: float, *, group: bool = False) -> None:
    """SIGTERM ``process``, SIGKILL it if it outlives ``grace_s``; returns once it has exited.

    With ``group``, the signals go to its whole process group, for a process started with
    ``start_new_session=True`` whose own children (a broker's JVM or Rust binary, say) must not outlive
    it: whatever is left of the group once the process has exited is killed too. SIGTERM first,
    because it lets a server shut down cleanly (flush logs, close sockets).
    """
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        _signal(process, sig, group)
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    if group:
        _signal(process, signal.SIGKILL, group)


def _signal(process: subprocess.Popen, sig: signal.Signals, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(process.pid, sig)
        else:
            process.send_signal(sig)


class Terminated(SystemExit):
    """SIGTERM, raised as an exception (``exit_on_sigterm``): a SystemExit, so nothing that catches
    Exception swallows it, with its own type, so that a command can say why it stopped."""


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process as ``Terminated(143)`` (a SystemExit), raised in the main thread.

    Schedulers, ``timeout`` and container runtimes stop a job with SIGTERM, and Python's default for it
    ends the process on the spot: no ``finally``, no ``with`` exit, no ``atexit``, so an embedded broker or
    a server the job started (each in a session of its own, out of the signal's reach) kept running. As an
    exception it unwinds like Ctrl-C does. A process forked after the call inherits the handler; there it
    does what the default would, so a worker pool's ``terminate`` still ends its workers at once.
    """
    owner = os.getpid()

    def _exit(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, _exit)


def wait_for_stop(stop: threading.Event, poll_s: float = 0.5) -> None:
    """Block the main thread until ``stop`` is set, by a signal handler that sets it, say.

    Not ``stop.wait()`` with no timeout: the kernel hands a process's signal to any of its threads that
    does not block it, and Python runs the handler in the main thread only once that thread runs Python
    code again. A main thread blocked on a lock with no timeout is woken only when the signal happens to
    interrupt its own wait; delivered to one of gRPC's or Kafka's threads instead, it waits for the next
    signal. ``recsys-rl serve`` once sat out a SIGTERM that way until it was killed (CI, 2026-12-07)."""
    while not stop.wait(poll_s):
        pass


def stop_group(pid: int, grace_s: float) -> None:
    """`stop_process` with ``group`` for a process we hold no handle to: one started by an earlier command
    (``recsys-rl broker start``) and stopped by a later one. Returns once the process is gone."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        if _gone_within(pid, wait_s):
            break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie counts until its parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _gone_within(pid: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(ChildProcessError):  # our own child: reap it, or it lingers as a zombie
            os.waitpid(pid, os.WNOHANG)
        if not alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
