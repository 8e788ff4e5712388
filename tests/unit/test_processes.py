"""stop_process: SIGTERM first, SIGKILL after the grace period, the whole group when asked."""

import subprocess
import sys
import time

from recsys_rl.processes import stop_process

SLEEPS = "import time; print('ready', flush=True); time.sleep(60)"
IGNORES_SIGTERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPS
# starts a child that ignores SIGTERM, says "ready <child pid>" once the child is ready, and waits
PARENT = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", {IGNORES_SIGTERM!r}], stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print("ready", child.pid, flush=True)
child.wait()
"""


def _start(code: str, **kwargs) -> tuple[subprocess.Popen, list[str]]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **kwargs)
    words = process.stdout.readline().split()
    assert words[0] == "ready"  # signal handlers are set before anything is signalled
    return process, words[1:]


def test_a_process_that_honours_sigterm_stops_with_it():
    process, _ = _start(SLEEPS)
    stop_process(process, grace_s=10)
    assert process.returncode == -15


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period():
    process, _ = _start(IGNORES_SIGTERM)
    started = time.monotonic()
    stop_process(process, grace_s=0.5)
    assert process.returncode == -9 and time.monotonic() - started >= 0.5


def test_with_group_the_children_stop_too():
    parent, (child,) = _start(PARENT, start_new_session=True)
    stop_process(parent, grace_s=0.5, group=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(int(child)):
        time.sleep(0.05)
    assert parent.returncode is not None and not _alive(int(child))


def test_an_exited_process_is_left_alone():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    stop_process(process, grace_s=1)
    stop_process(process, grace_s=1, group=True)
    assert process.returncode == 0


def _alive(pid: int) -> bool:
    """Running or stopped; a zombie (exited, waiting for init to reap it) is not alive."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
