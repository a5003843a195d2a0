"""worker/shutdown.py: the first SIGTERM/SIGINT drains, the second exits at once.

Real signals to a real process: each test runs a small Python process that enters
``graceful_signals`` and signals itself (a second signal ends the process, which pytest's
own must not). ``runconsumer`` draining on SIGTERM end to end is tested in tests/processes/.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from django_sqlqueue.worker.shutdown import FORCED_EXIT_STATUS, SIGNALS

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, os, signal, sys, threading, time
import django
from django.conf import settings

logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s %(message)s")

settings.configure(
    INSTALLED_APPS=["django_sqlqueue"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
)
django.setup()
from django_sqlqueue.worker.shutdown import graceful_signals

mode, sig = sys.argv[1], signal.Signals[sys.argv[2]]
drained = threading.Event()
calls = []
before = []
signal.signal(sig, lambda signum, frame: before.append(signum))  # the handler the block must restore


def on_first():
    calls.append(threading.current_thread().name)
    drained.set()


with graceful_signals(on_first):
    if mode != "none":
        os.kill(os.getpid(), sig)
        assert drained.wait(5), "on_first was not called"
        print("drained by", calls, flush=True)
    if mode == "twice":
        os.kill(os.getpid(), signal.SIGINT if sig == signal.SIGTERM else signal.SIGTERM)
        time.sleep(5)
        print("still running", flush=True)
threads = sorted(t.name for t in threading.enumerate())
os.kill(os.getpid(), sig)  # after the block: the previous handler's
time.sleep(0.1)
print("after the block:", calls, before, threads, flush=True)
"""


def run(mode: str, sig: signal.Signals) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, sig.name], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_the_first_signal_drains_on_a_thread_and_the_block_restores_the_previous_handler(sig: signal.Signals):
    proc = run("once", sig)
    assert proc.returncode == 0, proc.stderr
    # on_first ran once, on the watcher thread (never in the signal handler), and the process went on.
    assert "drained by ['sqlqueue-signals']" in proc.stdout
    # INFO, not WARNING (issue 29): deploys and scale-downs send it routinely.
    assert f"INFO django_sqlqueue.worker.shutdown received {sig.name}, draining (send it again to exit at once)" in (
        proc.stderr.splitlines()
    )
    # Once the block ended: the watcher thread is gone, the next signal went to the old handler.
    assert f"after the block: ['sqlqueue-signals'] [{int(sig)}] ['MainThread']" in proc.stdout


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_second_signal_exits_at_once_without_cleanup(sig: signal.Signals):
    proc = run("twice", sig)
    second = signal.SIGINT if sig == signal.SIGTERM else signal.SIGTERM
    assert proc.returncode == FORCED_EXIT_STATUS == 128 + signal.SIGTERM
    assert "drained by ['sqlqueue-signals']" in proc.stdout
    assert f"received {second.name} again, exiting now" in proc.stderr
    assert "still running" not in proc.stdout and "after the block" not in proc.stdout


def test_a_block_ended_without_a_signal_never_drains_and_leaves_no_thread():
    proc = run("none", signal.SIGTERM)
    assert proc.returncode == 0, proc.stderr
    assert f"after the block: [] [{int(signal.SIGTERM)}] ['MainThread']" in proc.stdout
