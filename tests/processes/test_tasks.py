"""Task backend, schedules and --concurrency with real runconsumer processes (slow).

- kill -9 of a worker in the middle of a task: another worker runs it again;
- lazy RUNNING (``MARK_RUNNING_AFTER``): ``get_result()`` says RUNNING while a task runs;
  a worker killed after the task's result was written and before its ack loses nothing
  (the result is SUCCESSFUL at once, the redelivery does not run it again); one killed
  before the RUNNING row was written leaves the attempt counted on the next one;
- a schedule firing every second, with 3 workers: each tick fires once, none is missed;
- ``--concurrency 8`` with a 50 ms I/O-bound handler handles >= 6x the messages/s of
  ``--concurrency 1``, and every partition's messages are handled in offset order.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_sqlqueue import publish_many
from django_sqlqueue.models import Message
from django_sqlqueue.rules.partitioning import partition_for
from django_sqlqueue.task_models import TaskResultRecord
from django_sqlqueue.tasks.compat import TaskResultStatus
from tests.support.processes import ConsumerProcess
from tests.support.task_helpers import task_settings, wait_until
from tests.support.taskapp import tasks
from tests.support.taskapp.consumers import CONC_GROUP, CONC_TOPIC
from tests.support.taskapp.models import Run

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _tasks_configured() -> Iterator[None]:
    with task_settings():
        yield


@pytest.fixture
def runconsumer(runconsumer: Callable[..., ConsumerProcess]) -> Callable[..., ConsumerProcess]:
    """``runconsumer`` processes (conftest) with the task test app's settings."""
    return lambda name, *args, **kwargs: runconsumer(
        name, *args, settings="tests.support.taskapp.process_settings", **kwargs
    )


def test_kill_9_mid_task_runs_it_again_on_another_worker(runconsumer: Callable[..., ConsumerProcess]) -> None:
    env = {"TSK_VISIBILITY_TIMEOUT": "2"}
    first = runconsumer("tsk-a", "--group", "tasks", env=env)
    result = tasks.sleepy.enqueue("nap", 1.5)
    wait_until(lambda: Run.objects.filter(label="nap:start").exists(), 20, "the task to start", 0.05)
    first.kill9()
    assert not Run.objects.filter(label="nap").exists()  # killed before it finished
    second = runconsumer("tsk-b", "--group", "tasks", env=env)

    def done() -> Any:
        fresh = tasks.sleepy.get_result(result.id)
        return fresh if fresh.is_finished else None

    finished = wait_until(done, 30, "the task to be run again")
    assert finished.status == TaskResultStatus.SUCCESSFUL, second.log()
    assert finished.attempts == 2
    starts = list(Run.objects.filter(label="nap:start").values_list("pid", flat=True))
    assert starts == [first.pid, second.pid]
    assert list(Run.objects.filter(label="nap").values_list("pid", flat=True)) == [second.pid]
    assert second.terminate() == 0


def test_get_result_says_running_while_a_task_runs_with_the_lazy_write(
    runconsumer: Callable[..., ConsumerProcess],
) -> None:
    worker = runconsumer("tsk-lazy", "--group", "tasks")
    result = tasks.sleepy.enqueue("lazy", 3.0)
    wait_until(lambda: Run.objects.filter(label="lazy:start").exists(), 20, "the task to start", 0.02)
    started = time.monotonic()
    # The default MARK_RUNNING_AFTER (0.1 s) after the start, the row says RUNNING.
    running = wait_until(
        lambda: (r := tasks.sleepy.get_result(result.id)).status == TaskResultStatus.RUNNING and r,
        2.0,  # (0.1 s, and slack for a loaded machine)
        "the result to say RUNNING",
        0.02,
    )
    assert time.monotonic() - started < 2.5
    assert not Run.objects.filter(label="lazy").exists()  # still running
    assert running.started_at is not None and running.finished_at is None
    assert running.attempts == 1 and running.worker_ids[0].endswith(f":{worker.pid}")

    def done() -> Any:
        fresh = tasks.sleepy.get_result(result.id)
        return fresh if fresh.is_finished else None

    finished = wait_until(done, 20, "the task to finish")
    assert finished.status == TaskResultStatus.SUCCESSFUL and finished.return_value == "slept"
    assert finished.started_at == running.started_at and finished.attempts == 1
    assert worker.terminate() == 0


def test_kill_9_after_the_result_is_written_loses_nothing(runconsumer: Callable[..., ConsumerProcess]) -> None:
    # The worker dies after the short task wrote its (lazy, single) result row, before the ack.
    env = {"TSK_VISIBILITY_TIMEOUT": "2", "TSK_LINGER_AFTER_FINISH": "30"}
    first = runconsumer("tsk-k1", "--group", "tasks", env=env)
    result = tasks.add.enqueue(2, 3)
    wait_until(lambda: Run.objects.filter(label="finished-signal").exists(), 20, "the task to finish", 0.02)
    first.kill9()
    fresh = tasks.add.get_result(result.id)
    assert fresh.status == TaskResultStatus.SUCCESSFUL and fresh.return_value == 5
    assert fresh.attempts == 1 and fresh.worker_ids[0].endswith(f":{first.pid}")
    # Redelivered after the visibility timeout: found finished, acked, not run again.
    second = runconsumer("tsk-k2", "--group", "tasks", env={"TSK_VISIBILITY_TIMEOUT": "2"})
    wait_until(lambda: "not run again" in second.log(), 30, "the redelivery to be acked")
    assert Run.objects.filter(label="add").count() == 1
    again = tasks.add.get_result(result.id)
    assert again.status == TaskResultStatus.SUCCESSFUL and again.attempts == 1
    assert second.terminate() == 0


def test_kill_9_before_the_running_row_counts_the_lost_attempt(runconsumer: Callable[..., ConsumerProcess]) -> None:
    env = {"TSK_VISIBILITY_TIMEOUT": "2", "TSK_MARK_RUNNING_AFTER": "60"}
    first = runconsumer("tsk-e1", "--group", "tasks", env=env)
    result = tasks.sleepy.enqueue("early", 1.5)
    wait_until(lambda: Run.objects.filter(label="early:start").exists(), 20, "the task to start", 0.05)
    first.kill9()
    # No row yet: the message says READY (its delivery times out, then it runs again).
    assert not TaskResultRecord.objects.filter(id=result.id).exists()
    assert tasks.sleepy.get_result(result.id).status == TaskResultStatus.READY
    second = runconsumer("tsk-e2", "--group", "tasks", env=env)

    def done() -> Any:
        fresh = tasks.sleepy.get_result(result.id)
        return fresh if fresh.is_finished else None

    finished = wait_until(done, 30, "the task to be run again")
    assert finished.status == TaskResultStatus.SUCCESSFUL, second.log()
    assert finished.attempts == 2
    assert finished.worker_ids[0] == "unrecorded" and finished.worker_ids[1].endswith(f":{second.pid}")
    assert list(Run.objects.filter(label="early:start").values_list("pid", flat=True)) == [first.pid, second.pid]
    assert second.terminate() == 0


def test_a_schedule_fires_each_tick_once_with_three_workers(runconsumer: Callable[..., ConsumerProcess]) -> None:
    env = {"TSK_SCHEDULE": "1"}
    workers = [runconsumer(f"tsk-s{i}", "--group", "tasks", env=env) for i in range(3)]
    wait_until(lambda: Run.objects.filter(label="tick").count() >= 6, 30, "six ticks run")
    time.sleep(1.5)
    for w in workers:
        assert w.terminate() == 0, w.log()
    # Every tick of the task schedule was enqueued once (deterministic result ids) and run once.
    ticks = sorted(
        TaskResultRecord.objects.filter(id__startswith="schedule:tsk-every-second:").values_list("id", flat=True)
    )
    assert len(ticks) >= 6
    assert Run.objects.filter(label="tick").count() == len(ticks)
    assert all(
        r.status == TaskResultStatus.SUCCESSFUL and len(r.worker_ids) == 1
        for r in TaskResultRecord.objects.filter(id__in=ticks)
    )
    _assert_consecutive_seconds(ticks)
    # The message schedule: one message per tick, consecutive.
    messages = sorted(Message.objects.filter(topic="tsk.ticks").values_list("id", flat=True))
    assert len(messages) >= 6
    _assert_consecutive_seconds(messages)
    # And the firing was spread: more than one worker fired ticks (not required, but expected).
    fired_by = {w.name for w in workers if "fired tick" in w.log()}
    assert fired_by, "no worker logged a fired tick"


def _assert_consecutive_seconds(ids: list[str]) -> None:
    import datetime as dt

    # ids are "schedule:<name>:<tick>", tick as 2026-01-01T03:00:00Z
    stamps = [dt.datetime.strptime(i.split(":", 2)[2], "%Y-%m-%dT%H:%M:%SZ") for i in ids]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert gaps and all(g == 1 for g in gaps), (ids, gaps)


def _keys_for_partitions(n: int) -> list[str]:
    keys: dict[int, str] = {}
    i = 0
    while len(keys) < n:
        keys.setdefault(partition_for(f"k{i}", n), f"k{i}")
        i += 1
    return [keys[p] for p in range(n)]


def _throughput(runconsumer: Callable[..., ConsumerProcess], run: str, concurrency: int, per_partition: int) -> float:
    keys = _keys_for_partitions(8)
    publish_many(
        CONC_TOPIC,
        [{"payload": {"run": run, "seq": s}, "key": k} for s in range(per_partition) for k in keys],
    )
    total = per_partition * len(keys)
    worker = runconsumer(f"tsk-{run}", "--group", CONC_GROUP, "--concurrency", str(concurrency))
    wait_until(lambda: Run.objects.filter(label=run).count() >= total, 120, f"{total} messages handled ({run})", 0.2)
    assert worker.terminate() == 0, worker.log()
    rows = list(Run.objects.filter(label=run).values_list("key", "seq", "started", "finished"))
    assert len(rows) == total  # each once
    by_partition: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for partition, seq, started, _ in rows:
        by_partition[partition].append((started, seq))
    assert len(by_partition) == 8
    for partition, runs in by_partition.items():
        seqs = [seq for _, seq in sorted(runs)]
        assert seqs == list(range(per_partition)), f"partition {partition} out of order: {seqs}"
    span = max(r[3] for r in rows) - min(r[2] for r in rows)
    return total / span


def test_concurrency_8_handles_six_times_the_messages_of_concurrency_1(
    runconsumer: Callable[..., ConsumerProcess],
) -> None:
    one = _throughput(runconsumer, "c1", 1, per_partition=8)  # 64 messages, ~3.5 s
    eight = _throughput(runconsumer, "c8", 8, per_partition=60)  # 480 messages, ~3.5 s
    print(f"\nconcurrency 1: {one:.1f} msg/s; concurrency 8: {eight:.1f} msg/s; ratio {eight / one:.2f}")
    assert one < 21  # 50 ms per message, one at a time
    assert eight >= 6 * one
