"""healthfile.py and ``runconsumer --health-file``: touched after healthy rounds, stale when the worker stops.

The process test runs a real ``runconsumer`` and SIGSTOPs it: nothing is mocked.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from django_sqlqueue.worker.healthfile import HealthFile

from ..support.processes import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_touched_when_healthy_at_most_once_per_interval(tmp_path):
    path = tmp_path / "alive"
    clock = Clock()
    beat = HealthFile(str(path), interval=1.0, clock=clock)
    beat.beat(healthy=False)
    assert not path.exists()  # an unhealthy round does not create it
    beat.beat(healthy=True)
    assert path.exists()
    os.utime(path, (0, 0))
    clock.now += 0.5
    beat.beat(healthy=True)
    assert path.stat().st_mtime == 0  # within the interval: not touched again
    clock.now += 0.6
    beat.beat(healthy=False)
    assert path.stat().st_mtime == 0  # due, but the round was not healthy
    beat.beat(healthy=True)
    assert path.stat().st_mtime > time.time() - 60


def test_no_path_does_nothing_and_a_bad_path_warns_once(tmp_path, caplog):
    HealthFile(None).beat(healthy=True)
    clock = Clock()
    beat = HealthFile(str(tmp_path / "missing-dir" / "alive"), interval=1.0, clock=clock)
    for _ in range(3):
        beat.beat(healthy=True)
        clock.now += 2
    assert [r.getMessage() for r in caplog.records].count(
        f"cannot touch the health file path={tmp_path / 'missing-dir' / 'alive'} "
        f"error=[Errno 2] No such file or directory: '{tmp_path / 'missing-dir' / 'alive'}'"
    ) == 1


def age(path: Path) -> float:
    return time.time() - path.stat().st_mtime


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_touches_it_and_it_goes_stale_when_the_worker_is_stopped(runconsumer, tmp_path):
    path = tmp_path / "alive"
    worker = runconsumer("hf", "--group", "g1", "--topic", "proc.events", "--health-file", str(path))
    wait_until(path.exists, 30, "the worker creates the health file", show=worker.log)
    first = path.stat().st_mtime
    wait_until(lambda: path.stat().st_mtime > first, 5, "the worker touches it again", show=worker.log)
    assert age(path) < 3
    worker.signal(signal.SIGSTOP)
    try:
        time.sleep(1.5)  # a touch in flight when stopped lands within this
        stopped = path.stat().st_mtime
        time.sleep(3)
        assert path.stat().st_mtime == stopped and age(path) > 3
        # The probe's own test: `test $(($(date +%s) - $(stat -c %Y PATH))) -lt 3` now fails.
        assert os.system(f'test $(($(date +%s) - $(stat -c %Y "{path}"))) -lt 3') != 0
    finally:
        worker.signal(signal.SIGCONT)
    wait_until(lambda: age(path) < 2, 10, "touched again once the worker runs", show=worker.log)
    assert os.system(f'test $(($(date +%s) - $(stat -c %Y "{path}"))) -lt 3') == 0
    assert worker.terminate() == 0


def test_the_directory_must_exist(tmp_path):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="its directory does not exist"):
        call_command("runconsumer", "--health-file", str(tmp_path / "nope" / "alive"))
