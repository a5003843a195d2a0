"""Operator actions against real ``runconsumer`` processes: dead-letter replay reaches the failing
group only, and a rewind with live workers redelivers everything it said it would."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import close_old_connections

from django_sqlqueue import ops, publish, publish_many
from django_sqlqueue.models import ConsumerOffset, Message

from ..support.processes import ConsumerProcess

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def runconsumer(runconsumer: Callable[..., ConsumerProcess]) -> Callable[[str], ConsumerProcess]:
    """``runconsumer`` processes (conftest) with the console test consumers."""
    return lambda name: runconsumer(name, settings="tests.support.console_process_settings")


def wait_for(condition: Callable[[], Any], timeout: float, what: str, procs: list[ConsumerProcess] = ()) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        close_old_connections()
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    logs = "\n".join(p.log()[-3000:] for p in procs)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{logs}")


def handled(group: str | None = None) -> list[dict]:
    rows = [m.payload for m in Message.objects.filter(topic="console.handled").order_by("seq")]
    return [r for r in rows if group is None or r["group"] == group]


def dead_letter_of(group: str, message_id: str) -> Message | None:
    return Message.objects.filter(topic="console.events_dlq", id=f"{group}:{message_id}").first()


def caught_up(group: str) -> bool:
    heads = {part: head for (_, part), head in ops.groups.heads("console.events").items()}
    marks = {
        o.partition: o.offset_acked for o in ConsumerOffset.objects.filter(consumer_group=group, topic="console.events")
    }
    return bool(heads) and all(marks.get(p, 0) >= h for p, h in heads.items())


def fail_then_replay_scenario(runconsumer: Callable[[str], ConsumerProcess]) -> tuple[ConsumerProcess, str, Message]:
    """Publish a message that c1 fails (dead-lettered) and c2 handles; return the worker, flag file, dead letter."""
    fd, flag = tempfile.mkstemp(prefix="console-fail-")
    os.close(fd)
    publish("console.events", {"fail_while": flag, "fail_groups": ["c1"]}, key="k", id="m1")
    worker = runconsumer("w1")
    dead = wait_for(lambda: dead_letter_of("c1", "m1"), 30, "c1's dead letter of m1", [worker])
    wait_for(lambda: handled("c2"), 30, "c2 to handle m1", [worker])
    return worker, flag, dead


def test_replay_reaches_the_failing_group_only(runconsumer):
    worker, flag, dead = fail_then_replay_scenario(runconsumer)
    os.unlink(flag)  # the "bug" is fixed: c1 succeeds now
    result = ops.replay([dead.seq], actor="test")
    assert result.done == 1
    assert ops.replay([dead.seq]).missing == 1  # a second click replays nothing
    got = wait_for(lambda: handled("c1"), 30, "c1 to handle the replay", [worker])
    assert len(got) == 1 and got[0]["replay"]["consumer_group"] == "c1" and got[0]["replay"]["original_id"] == "m1"
    # c2 reads the copy too, acks it without handling: wait until it is past it, then check.
    wait_for(lambda: caught_up("c2") and caught_up("c1"), 30, "both groups past the copy", [worker])
    assert [h["id"] for h in handled("c2")] == ["m1"]
    assert len(handled("c1")) == 1
    assert ops.count_dead_letters() == 0


def test_rewind_with_live_workers_redelivers_everything_once_more(runconsumer):
    publish_many("console.events", [{"payload": {"n": i}, "key": f"k{i % 5}", "id": f"r{i}"} for i in range(40)])
    workers = [runconsumer("w1"), runconsumer("w2")]
    wait_for(lambda: caught_up("c1") and len(handled("c1")) >= 40, 60, "c1 to handle 40 messages", workers)
    first = len(handled("c1"))
    plan = ops.seek("c1", "console.events", position="earliest")
    assert plan.redeliver == 40 and plan.skip == 0
    wait_for(
        lambda: len({h["id"] for h in handled("c1")[first:]}) == 40 and caught_up("c1"),
        60,
        "every message of c1 delivered again after the rewind",
        workers,
    )
    # c2 was not touched.
    assert sorted(h["id"] for h in handled("c2")) == sorted(f"r{i}" for i in range(40))
    # Fast-forward while idle: nothing more is delivered, and a later publish still is.
    before = len(handled("c1"))
    ops.seek("c1", "console.events", position="latest")
    publish("console.events", {"n": "after"}, key="k1", id="after")
    wait_for(lambda: any(h["id"] == "after" for h in handled("c1")), 30, "c1 to handle the next message", workers)
    assert [h["id"] for h in handled("c1")[before:]] == ["after"]
