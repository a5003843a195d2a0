"""A handler that never returns, in real ``runconsumer`` processes (issue 14's case).

Two workers, one topic of 8 partitions, one message whose handler hangs forever (an HTTP
call without a timeout) and 200 ordinary ones; ``visibility_timeout`` 3 s (so the
handler's timeout is 3 s), ``LEASE_DURATION`` 3 s (tests/support/process_settings.py). Before
handler timeouts, the stuck worker went on renewing every lease it held and a third of
the messages waited forever.
"""

from __future__ import annotations

import time

import pytest

from django_sqlqueue import publish, publish_many
from django_sqlqueue.models import Message, PartitionLease
from tests.support.consumerapp.models import Handled
from tests.support.engine_helpers import key_for_partition
from tests.support.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOPIC = "proc.hang"
GROUP = "hang"
VISIBILITY_TIMEOUT = 3  # tests/support/consumerapp/consumers.py
LEASE_DURATION = 3  # tests/support/process_settings.py


def handled_others(ids: set[str]) -> int:
    return Handled.objects.filter(group=GROUP, message_id__in=ids).values("message_id").distinct().count()


def dead_letter(message_id: str) -> Message | None:
    return Message.objects.filter(topic=f"{TOPIC}_dlq", id=f"{GROUP}:{message_id}").first()


def test_a_hung_handler_does_not_stall_the_queue_and_ends_in_the_dlq(runconsumer):
    hung = publish(TOPIC, {"hang": True}, key=key_for_partition(0))
    others = publish_many(TOPIC, [{"payload": {"i": i}, "key": f"key-{i}"} for i in range(200)])
    ids = {m.id for m in others}
    workers = [runconsumer(name, "--group", GROUP, "--topic", TOPIC) for name in ("a", "b")]
    for worker in workers:
        worker.expected_status = 1  # a worker may time out both attempts: 2 stuck threads > --concurrency 1

    first = wait_until(lambda: Handled.objects.filter(message_id=hung.id).first(), 30, "the hung handler starts")
    aim = VISIBILITY_TIMEOUT + 2 * LEASE_DURATION + 5  # the bound plus a few polls and CI slack
    wait_until(lambda: handled_others(ids) == 200, aim + 10, "the 200 others handled")
    last = Handled.objects.filter(message_id__in=ids).order_by("-handled_at").first()
    took = (last.handled_at - first.handled_at).total_seconds()
    print(f"\nthe 200 others were all handled {took:.1f}s after the hung handler started (aim: <= {aim}s)")
    assert took <= aim

    # Each attempt timed out; the second (max_attempts=2) was dead-lettered with the timeout.
    dead = wait_until(lambda: dead_letter(hung.id), 30, "the hung message dead-lettered")
    assert dead.failure_count == 2
    assert dead.last_error.startswith("django_sqlqueue.exceptions.HandlerTimeout: handler ")
    assert "tests.support.consumerapp.consumers.hang_or_record" in dead.last_error
    assert list(Handled.objects.filter(message_id=hung.id).values_list("attempt", flat=True).order_by("attempt")) == [
        1,
        2,
    ]
    logs = "".join(w.log() for w in workers)
    warnings = [
        line
        for line in logs.splitlines()
        if "WARNING django_sqlqueue.worker.threads.watchdog handler timed out" in line
    ]
    assert len(warnings) == 2, logs
    assert all(
        f"id={hung.id}" in line and "handler=tests.support.consumerapp.consumers.hang_or_record" in line
        for line in warnings
    )
    assert "Traceback" not in logs


def test_more_stuck_handlers_than_concurrency_exit_non_zero_after_releasing_leases(runconsumer):
    hung = publish(TOPIC, {"hang": True}, key=key_for_partition(0))
    worker = runconsumer("lone", "--group", GROUP, "--topic", TOPIC)
    worker.expected_status = 1
    started = time.monotonic()
    status = worker.proc.wait(60)
    assert status == 1, worker.log()
    log = worker.log()
    assert "2 handler threads are stuck in handlers that overran their timeout, more than --concurrency 1" in log
    assert time.monotonic() - started < 30
    assert not PartitionLease.objects.filter(leased_by="lone").exists()  # released, not left to expire
    dead = dead_letter(hung.id)
    assert dead is not None and dead.failure_count == 2
