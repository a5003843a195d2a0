"""``async def`` handlers: awaited by the worker, with the outcomes of sync handlers.

Worker.run() on a thread against the real database (as tests/worker/test_loop.py); the handlers
use Django's async ORM, as an async view would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools

import pytest
from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation

from django_sqlqueue import Reject, Retry, publish, publish_many
from django_sqlqueue.models import DeliveryState, Message
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from tests.support.consumerapp.models import Handled

from ...support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    Calls,
    caught_up,
    db_now,
    dead_letters,
    delivery_rows,
    row,
    running,
    spec,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def record(message) -> None:
    """What the process consumers do, through the async ORM."""
    await Handled.objects.acreate(
        group=message.group,
        topic=message.topic,
        partition=message.partition,
        key=message.key,
        offset=message.offset,
        message_id=message.id,
        attempt=message.attempt,
        worker="async",
    )


def handled(topic: str) -> list[tuple[str, int, int]]:
    return list(Handled.objects.filter(topic=topic).values_list("key", "offset", "attempt").order_by("id"))


def test_async_handler_is_awaited_and_acked_in_offset_order():
    topic, keys = "a.orders", ["a", "b"]
    publish_many(topic, [{"payload": {"i": i}, "key": keys[i % 2]} for i in range(20)])
    loops = Calls()

    async def handle(message):
        await asyncio.sleep(0)  # a real suspension point: the coroutine must be driven
        loops.add(id(asyncio.get_running_loop()))
        await record(message)

    with running([spec(topic, "g", handle, batch_size=4)]) as worker:
        wait_until(lambda: caught_up("g", topic), what="20 messages")
        # Published while it runs: the same loop keeps serving.
        publish_many(topic, [{"payload": {"i": i}, "key": "a"} for i in range(20, 25)])
        wait_until(lambda: caught_up("g", topic), what="5 more")

    seen = handled(topic)
    assert len(seen) == 25
    assert [off for k, off, _ in seen if k == "a"] == list(range(1, 16))
    assert [off for k, off, _ in seen if k == "b"] == list(range(1, 11))
    assert {attempt for _, _, attempt in seen} == {1}
    assert len(set(loops.list())) == 1  # one event loop for the worker, reused for every message
    assert (worker.stats.delivered, worker.stats.acked, worker.stats.nacked) == (25, 25, 0)
    assert delivery_rows("g", topic) == []
    assert worker.invoke._loop is None  # closed when the worker stopped


def test_async_handler_exception_nacks_and_is_retried_with_backoff():
    topic = "a.fail"
    publish(topic, "x", key="k", id="af-1")

    async def handle(message):
        await record(message)
        if message.attempt < 3:
            raise ValueError(f"boom {message.attempt}")

    with running([spec(topic, "g", handle, max_attempts=5)]) as worker:
        wait_until(lambda: caught_up("g", topic), what="third attempt acks")

    assert handled(topic) == [("k", 1, 1), ("k", 1, 2), ("k", 1, 3)]
    assert (worker.stats.nacked, worker.stats.acked, worker.stats.dead_lettered) == (2, 1, 0)
    assert dead_letters(f"{topic}_dlq") == []


def test_async_handler_retry_with_delay_postpones_redelivery():
    topic = "a.retry"
    publish(topic, "x", key="k")
    attempts = Calls()

    async def handle(message):
        attempts.add((message.attempt, await sync_to_async(db_now)()))
        if message.attempt == 1:
            raise Retry("not yet", delay=1.0)

    with running([spec(topic, "g", handle)]):
        wait_until(lambda: len(attempts) == 1)
        waiting = wait_until(lambda: DeliveryState.objects.filter(topic=topic, status=RETRY).first(), what="nack")
        first_at = attempts.list()[0][1]
        assert first_at + dt.timedelta(seconds=1) <= waiting.invisible_until
        wait_until(lambda: caught_up("g", topic), what="second attempt")

    (a1, t1), (a2, t2) = attempts.list()
    assert (a1, a2) == (1, 2)
    assert t2 - t1 >= dt.timedelta(seconds=1)


def test_async_handler_reject_dead_letters_at_once():
    topic = "a.reject"
    publish(topic, {"bad": True}, key="k", id="ar-1")
    publish(topic, {"bad": False}, key="k", id="ar-2")

    async def handle(message):
        await record(message)
        if message.payload["bad"]:
            raise Reject("poison")

    with running([spec(topic, "g", handle)]) as worker:
        wait_until(lambda: caught_up("g", topic), what="both settled")

    assert handled(topic) == [("k", 1, 1), ("k", 2, 1)]
    (dl,) = dead_letters(f"{topic}_dlq")
    assert dl.payload == {"bad": True}
    assert "Reject: poison" in dl.last_error
    assert (worker.stats.dead_lettered, worker.stats.acked) == (1, 1)


def test_async_handler_failing_every_attempt_ends_in_the_dlq_with_its_traceback():
    topic = "a.always"
    publish(topic, "x", key="k", id="aa-1")

    async def handle(message):
        await record(message)
        raise RuntimeError("always broken")

    with running([spec(topic, "g", handle, max_attempts=2)]) as worker:
        wait_until(lambda: dead_letters(f"{topic}_dlq"), what="dead letter")
        wait_until(lambda: caught_up("g", topic), what="watermark past it")

    assert [a for _, _, a in handled(topic)] == [1, 2]
    (dl,) = dead_letters(f"{topic}_dlq")
    assert dl.last_error.startswith("builtins.RuntimeError: always broken")
    assert "in handle" in dl.last_error  # the coroutine's frame is in the traceback
    assert worker.stats.dead_lettered == 1


def test_sync_orm_in_an_async_handler_raises_synchronous_only_operation_and_nacks():
    """As in an async view: the sync ORM is refused inside the event loop; the message is nacked, not lost."""
    topic = "a.syncorm"
    publish(topic, "x", key="k")
    errors = Calls()

    async def handle(message):
        try:
            Message.objects.count()
        except SynchronousOnlyOperation as exc:
            errors.add((message.attempt, type(exc).__name__))
            if message.attempt == 1:
                raise
        await record(message)

    with running([spec(topic, "g", handle)]) as worker:
        wait_until(lambda: caught_up("g", topic), what="second attempt")

    assert errors.list() == [(1, "SynchronousOnlyOperation"), (2, "SynchronousOnlyOperation")]
    assert worker.stats.nacked == 1 and worker.stats.acked == 1


def test_aextend_visibility_moves_invisible_until_and_the_sync_call_is_refused():
    topic = "a.extend"
    publish(topic, "long job", key="k")
    seen = Calls()

    async def handle(message):
        with pytest.raises(RuntimeError, match="aextend_visibility"):
            message.extend_visibility(60)
        before = (await sync_to_async(row)("g", topic, message.partition, message.offset)).invisible_until
        called_at = await sync_to_async(db_now)()
        await message.aextend_visibility(60)
        after = await sync_to_async(row)("g", topic, message.partition, message.offset)
        with pytest.raises(ValueError, match="positive number"):
            await message.aextend_visibility(0)
        seen.add((before, called_at, after.invisible_until, after.retry_count, after.status))

    with running([spec(topic, "g", handle, visibility_timeout=5)]) as worker:
        wait_until(lambda: caught_up("g", topic))

    ((before, called_at, after, retry_count, status),) = seen.list()
    assert before <= called_at + dt.timedelta(seconds=5)
    assert after >= called_at + dt.timedelta(seconds=60)
    assert (retry_count, status) == (0, IN_FLIGHT)
    assert worker.stats.acked == 1  # the pytest.raises inside did not fail the handler


def test_handler_returning_an_awaitable_is_awaited_too():
    """Not only ``async def``: a partial of one, or any callable returning a coroutine."""
    topic = "a.partial"
    publish_many(topic, [{"payload": i, "key": "k"} for i in range(3)])

    async def handle(message, *, tag):
        await record(message)

    with running([spec(topic, "g", functools.partial(handle, tag="x"))]):
        wait_until(lambda: caught_up("g", topic))
    assert handled(topic) == [("k", 1, 1), ("k", 2, 1), ("k", 3, 1)]


def test_runner_close_cancels_left_behind_tasks_and_closes_the_loop():
    runner = HandlerRunner()
    cancelled = []

    async def forever():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def spawn(message):
        asyncio.get_running_loop().create_task(forever())
        return message * 2

    assert runner(spawn, 21) == 42
    assert runner(lambda m: m + 1, 1) == 2  # sync handlers are plain calls
    loop = runner._loop
    runner.close()
    assert cancelled == [True]
    assert loop is not None and loop.is_closed()


@pytest.mark.slow
def test_runconsumer_process_runs_an_async_handler(runconsumer):
    """A real ``runconsumer`` process: async handler recording via the async ORM; a failure is
    retried, a Reject dead-lettered, a long one extends its visibility; nothing is lost."""
    topic = "proc.async"
    plain = publish_many(topic, [{"payload": {"i": i}, "key": f"p{i % 2}"} for i in range(6)])
    flaky = publish(topic, {"fail_first": ["async"]}, key="p0", id="flaky")
    poison = publish(topic, {"reject": ["async"]}, key="p1", id="poison")
    slow = publish(topic, {"sleep": 1}, key="p1", id="slow")
    process = runconsumer("aw", "--group", "async")

    wait_until(lambda: caught_up("async", topic), timeout=30, what="proc.async drained")
    assert process.terminate() == 0

    attempts: dict[str, list[int]] = {}
    for message_id, attempt in Handled.objects.filter(topic=topic).values_list("message_id", "attempt"):
        attempts.setdefault(message_id, []).append(attempt)
    assert attempts == {
        **{m.id: [1] for m in plain},
        flaky.id: [1, 2],
        poison.id: [1],
        slow.id: [1],
    }
    (dl,) = dead_letters(f"{topic}_dlq")
    assert dl.payload == {"reject": ["async"]} and "Reject: poison message poison" in dl.last_error
    log = process.log()
    assert "handler failed, retrying in" in log and "id=flaky attempt=1/3" in log
    assert "Traceback (most recent call last)" in log and "ScriptedFailure: scripted failure of flaky" in log
    assert "never awaited" not in log and "RuntimeWarning" not in log
