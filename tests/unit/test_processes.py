"""stop_process: SIGTERM, then SIGKILL after the grace period, the whole group when asked; exit_on_sigterm."""

import os
import signal
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


# installs exit_on_sigterm, then forks a child that inherits it; each says it is ready from inside its try
UNWINDS = """
import atexit, os, sys, time
from recsys_rl.processes import exit_on_sigterm
exit_on_sigterm()
atexit.register(lambda: print("atexit ran", flush=True))
child = os.fork()
if child == 0:
    try:
        os.write(1, b"child ready\\n")  # one write each: the two processes share the pipe
        time.sleep(60)
    finally:
        print("child unwound", flush=True)
try:
    os.write(1, f"parent ready {child}\\n".encode())
    time.sleep(60)
finally:
    print("finally ran", flush=True)
"""


def test_after_exit_on_sigterm_sigterm_unwinds_the_process_and_exits_143():
    process = subprocess.Popen([sys.executable, "-c", UNWINDS], stdout=subprocess.PIPE, text=True)
    ready = sorted(process.stdout.readline().split() for _ in range(2))
    assert [words[:2] for words in ready] == [["child", "ready"], ["parent", "ready"]]
    os.kill(int(ready[1][2]), signal.SIGTERM)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 143
    assert out.splitlines() == ["finally ran", "atexit ran"]  # the forked child died as by default: silent


# a SIGTERM handler that sets an event, and a thread that hands the signal to itself, not to the main thread
ANOTHER_THREADS_SIGNAL = """
import signal, threading, time
from recsys_rl.processes import wait_for_stop
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
def deliver():
    time.sleep(0.2)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
threading.Thread(target=deliver).start()
wait_for_stop(stop)
print("stopped", flush=True)
"""


def test_a_stop_signal_handed_to_another_thread_still_ends_the_wait():
    """What ``recsys-rl serve`` waits with: a plain ``Event.wait()`` sat out such a signal for good."""
    out = subprocess.run(
        [sys.executable, "-c", ANOTHER_THREADS_SIGNAL], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert out == "stopped\n"
