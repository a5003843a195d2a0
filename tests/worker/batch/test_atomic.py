"""Atomic consumers (django_sqlqueue/worker/batch/atomic.py): the handler's writes and its ack commit together.

Real database, real workers on threads (``running``), real lease rows, real second
connections; nothing mocked. The handlers' effects are ``Handled`` rows, which have no
unique constraint: an effect applied twice would show as two rows.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial

import pytest
from django.db import connection, connections, transaction

from django_sqlqueue import ConfigurationError, consumer, publish
from django_sqlqueue.consumers import registry
from django_sqlqueue.db.store import FetchPlan
from django_sqlqueue.exceptions import FenceLost
from django_sqlqueue.models import DeliveryState, Message, PartitionLease
from django_sqlqueue.worker.batch.atomic import Abandoned, ack_and_commit, run_in_transaction
from django_sqlqueue.worker.batch.outcomes import Outcomes
from django_sqlqueue.worker.batch.progress import BatchProgress
from tests.conftest import Worker as Thread
from tests.support.consumerapp.models import Handled

from ...support.engine_helpers import (
    IN_FLIGHT,
    RETRY,
    Calls,
    age_lease,
    caught_up,
    dead_letters,
    fast_conf,
    lock_waiting,
    not_on_sqlite,
    publish_to,
    row,
    running,
    session_id,
    spec,
    store,
    wait_until,
    watermark,
)
from .helpers import leased_batch

pytestmark = pytest.mark.django_db(transaction=True)

TOPIC = "atomic.events"
DOWN = "atomic.down"
GROUP = "g"
DLQ = f"{TOPIC}_dlq"


def effect(message, worker: str = "t1") -> Handled:
    """The handler's effect: one row per call."""
    return Handled.objects.create(
        group=message.group,
        topic=message.topic,
        partition=message.partition,
        key=message.key,
        offset=message.offset,
        message_id=message.id,
        attempt=message.attempt,
        worker=worker,
    )


def effects(topic: str = TOPIC) -> list[tuple[int, int]]:
    return sorted(Handled.objects.filter(topic=topic).values_list("partition", "offset"))


def records(caplog: pytest.LogCaptureFixture, text: str, level: int = logging.WARNING) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == level and text in r.getMessage()]


# -- the transaction of one message -------------------------------------------------------


def test_the_handlers_writes_and_its_fenced_ack_commit_together_or_not_at_all():
    """``run_in_transaction`` + ``ack_and_commit``, as ``one_message`` chains them, on this thread."""
    topic = "atomic.parts"
    runner, sub, fetched, _ = leased_batch(topic, print, 2, group=GROUP, atomic=True)
    s = runner.store
    first, second = (runner.received(sub, m, None) for m in fetched)

    def ack(offset: int, progress: BatchProgress | None = None):
        return partial(ack_and_commit, s, sub, 0, [(offset, 0)], progress)

    assert run_in_transaction(s, sub, lambda: effect(first), ack(first.offset)) == first.offset  # the new watermark
    assert effects(topic) == [(0, first.offset)] and watermark(GROUP, topic, 0) == first.offset
    # The watchdog gave the batch up meanwhile: the ack is refused and the handler's write rolls back.
    progress = BatchProgress(sub, fetched, {0: first.offset}, Outcomes())
    assert progress.begin(1, 0.0) and progress.abandon(time.monotonic() + 1) is not None
    with pytest.raises(Abandoned):
        run_in_transaction(s, sub, lambda: effect(second), ack(second.offset, progress))
    # The lease is gone: the fence refuses the ack and the handler's write rolls back.
    assert store().release_leases(GROUP, topic, sub.name) == 1
    with pytest.raises(FenceLost):
        run_in_transaction(s, sub, lambda: effect(second), ack(second.offset))
    assert effects(topic) == [(0, first.offset)] and watermark(GROUP, topic, 0) == first.offset
    assert row(GROUP, topic, 0, second.offset).acked is False


# -- configuration -------------------------------------------------------------------------


def test_atomic_must_be_true_false_or_batch_and_the_error_names_the_consumer():
    with pytest.raises(ConfigurationError, match=r"g:atomic\.events.*atomic must be True, False or 'batch', got 'yes'"):
        consumer(TOPIC, group=GROUP, atomic="yes")
    with pytest.raises(ConfigurationError, match="got 1"):
        spec(TOPIC, GROUP, effect, atomic=1)
    for value in (True, False, "batch"):
        assert spec(TOPIC, GROUP, effect, atomic=value).atomic == value


def test_an_async_handler_cannot_be_atomic():
    async def handler(message):
        pass

    with pytest.raises(ConfigurationError, match="async def handler cannot be atomic"):
        consumer(TOPIC, group=GROUP, atomic=True)(handler)
    assert (GROUP, TOPIC) not in {(s.group, s.topic) for s in registry.all()}


# -- per message -----------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 4])
def test_effects_and_acks_commit_together(concurrency):
    publish_to(TOPIC, 0, 5)
    publish_to(TOPIC, 3, 2)
    with running([spec(TOPIC, GROUP, effect, atomic=True)], concurrency=concurrency):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="all acked")
    assert effects() == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (3, 1), (3, 2)]
    assert watermark(GROUP, TOPIC, 0) == 5


def test_a_failing_handler_leaves_no_effect_is_retried_and_dead_lettered_at_its_last_attempt():
    calls = Calls()

    def handler(message):
        effect(message)
        calls.add(message.attempt)
        raise RuntimeError("boom after writing")

    publish_to(TOPIC, 0, 1)
    with running([spec(TOPIC, GROUP, handler, atomic=True, max_attempts=3)]):
        wait_until(lambda: dead_letters(DLQ), what="dead letter")
        wait_until(lambda: caught_up(GROUP, TOPIC), what="watermark past the dead letter")
    assert calls.list() == [1, 2, 3]
    assert effects() == []
    assert "boom after writing" in dead_letters(DLQ)[0].last_error


def test_a_handler_that_fails_once_has_its_effect_exactly_once_and_its_nack_recorded():
    def handler(message):
        effect(message)
        if message.attempt == 1:
            raise RuntimeError("first attempt fails")

    publish_to(TOPIC, 0, 1)
    with running([spec(TOPIC, GROUP, handler, atomic=True)]) as worker:
        wait_until(lambda: caught_up(GROUP, TOPIC), what="acked")
    assert list(Handled.objects.values_list("offset", "attempt")) == [(1, 2)]
    assert worker.stats.nacked == 1 and worker.stats.acked == 1


def test_a_worker_that_lost_its_lease_during_the_handler_rolls_back_its_effects_and_its_ack(spawn, caplog):
    """The lease is taken while the handler runs (as a thief of an expired lease would): the
    handler's transaction holds no lock on the lease row (the thief's UPDATE does not wait),
    and the fence at the end rolls everything back."""
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    stolen = threading.Event()

    def steal() -> None:
        PartitionLease.objects.filter(consumer_group=GROUP, topic=TOPIC, partition=0).update(leased_by="thief")

    def handler(message):
        effect(message)
        publish(DOWN, {"from": message.offset})
        if not stolen.is_set():
            if connection.vendor == "sqlite":
                # One writer: nobody else can write while this transaction is open. Change the
                # row in it instead (rolled back with it): the fence reads what it would see.
                steal()
            else:
                spawn(steal).join_ok(timeout=5)  # would time out if the lease row were locked
            stolen.set()

    publish_to(TOPIC, 0, 1)
    with running([spec(TOPIC, GROUP, handler, atomic=True)]):
        wait_until(lambda: records(caplog, "transaction was rolled back"), what="the fence's rollback")
    assert effects() == [] and Message.objects.filter(topic=DOWN).count() == 0
    delivery = row(GROUP, TOPIC, 0, 1)
    assert (delivery.acked, delivery.status, delivery.retry_count) == (False, IN_FLIGHT, 0)
    assert watermark(GROUP, TOPIC, 0) == 0


def test_the_fence_refuses_a_delivery_that_is_no_longer_the_one_given_even_with_the_lease_held():
    """The lease lost and taken back by the same subscriber name while another worker
    redelivered the message: the lease alone would pass; the delivery row does not."""
    s = store()
    publish_to(TOPIC, 0, 2)
    assert s.acquire_leases(GROUP, TOPIC, [0], "A", 30) == [0]
    s.ensure_offsets(GROUP, TOPIC, [0])
    fresh = s.fetch(GROUP, TOPIC, [FetchPlan(0, 0, False)], 10)
    s.mark_delivered(GROUP, TOPIC, "A", fresh, [], [], 30)
    Handled.objects.all().delete()
    # Meanwhile someone else redelivered offset 1 (retry_count 0 -> 1).
    again = s.fetch(GROUP, TOPIC, [FetchPlan(0, None, False)], 10)
    assert again == []
    DeliveryState.objects.filter(consumer_group=GROUP, topic=TOPIC, partition=0, message_offset=1).update(retry_count=1)
    with pytest.raises(FenceLost, match="redelivered, nacked or acked elsewhere"):
        with transaction.atomic():
            Handled.objects.create(
                group=GROUP, topic=TOPIC, partition=0, offset=1, message_id="x", attempt=1, worker="A"
            )
            s.ack_in_transaction(GROUP, TOPIC, "A", 0, [(1, 0)])
    assert Handled.objects.count() == 0 and watermark(GROUP, TOPIC, 0) == 0
    # Offset 2 is still the delivery A was given: its ack goes through and moves nothing
    # (offset 1 below it is not acked).
    with transaction.atomic():
        assert s.ack_in_transaction(GROUP, TOPIC, "A", 0, [(2, 0)]) is None
    assert row(GROUP, TOPIC, 0, 2).acked
    with pytest.raises(FenceLost, match="lease"):
        with transaction.atomic():
            s.ack_in_transaction(GROUP, TOPIC, "B", 0, [(1, 1)])


def _stealer_after_commit(spawn, gap: bool) -> None:
    """A commits its atomic ack while B tries to steal A's expired lease: B's UPDATE waits for
    A's COMMIT, and B's poll then reads the ack: the message is not redelivered."""
    s = store()
    publish_to(TOPIC, 0, 2)
    assert s.acquire_leases(GROUP, TOPIC, [0], "A", 30) == [0]
    s.ensure_offsets(GROUP, TOPIC, [0])
    fresh = s.fetch(GROUP, TOPIC, [FetchPlan(0, 0, False)], 10)
    s.mark_delivered(GROUP, TOPIC, "A", fresh, [], [], 30)
    target = 1
    if gap:  # offset 1 failed (due again at once); A's atomic handler acks offset 2 above the gap
        s.nack(GROUP, TOPIC, "A", [(0, 1, 0.0)])
        target = 2
    age_lease(GROUP, TOPIC, 0, 60)  # expired: B may steal it
    fenced, go = threading.Event(), threading.Event()
    b_session: list[int] = []

    def a() -> None:
        with transaction.atomic():
            Handled.objects.create(
                group=GROUP, topic=TOPIC, partition=0, offset=target, message_id="m", attempt=1, worker="A"
            )
            s.ack_in_transaction(GROUP, TOPIC, "A", 0, [(target, 0)])
            fenced.set()
            assert go.wait(10)

    def b() -> list[int]:
        if connection.vendor != "sqlite":
            b_session.append(session_id())
        assert s.acquire_leases(GROUP, TOPIC, [0], "B", 2.0) == [0]  # waits for A's COMMIT
        states = s.poll_state(GROUP, TOPIC, "B", 2.0)
        plans = [FetchPlan(st.partition, max(st.watermark, st.delivered_max or 0), True) for st in states]
        return sorted(m.offset for m in s.fetch(GROUP, TOPIC, plans, 10))

    if connection.vendor == "sqlite":
        # One writer: B's UPDATE cannot even start before A's COMMIT. The claim left to
        # prove is the read path: after the commit, B's poll does not redeliver.
        go.set()
        spawn(a).join_ok()
        fetched = spawn(b).join_ok()
        assert target not in fetched and fetched == ([1] if gap else [])
        assert effects() == [(0, target)]
        return
    thread_a = spawn(a)
    assert fenced.wait(10)
    thread_b = spawn(b)
    wait_until(lambda: not thread_b.is_alive() or (b_session and stealing(b_session[0])), what="B waiting")
    assert thread_b.is_alive(), f"B did not wait for A's commit: {thread_b.error or thread_b.result}"
    go.set()
    thread_a.join_ok()
    fetched = thread_b.join_ok()
    assert target not in fetched
    assert fetched == ([1] if gap else [])  # only the nacked message is due again
    assert effects() == [(0, target)]
    assert PartitionLease.objects.get(consumer_group=GROUP, topic=TOPIC, partition=0).leased_by == "B"


def stealing(session: int) -> bool:
    """Whether ``session`` waits in its UPDATE of the lease row (PostgreSQL: for a lock; MariaDB:
    its UPDATE is running -- ``innodb_trx`` lags, the process list does not)."""
    if connection.vendor == "postgresql":
        return lock_waiting(session)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM information_schema.processlist WHERE id = %s "
            "AND info LIKE 'UPDATE queue_partition_leases%%'",
            [session],
        )
        return cursor.fetchone()[0] > 0


def test_a_stealer_waiting_on_the_fence_does_not_redeliver_what_the_atomic_transaction_acked(spawn):
    _stealer_after_commit(spawn, gap=False)


def test_a_stealer_does_not_redeliver_an_atomic_ack_above_a_gap(spawn):
    _stealer_after_commit(spawn, gap=True)


def test_a_stealing_worker_after_the_commit_handles_only_what_was_not_acked(caplog):
    """Worker A commits offset 2 atomically while offset 1 waits for a retry; A stops without
    releasing (its lease expires); worker B takes over: it handles offset 1 only."""
    calls_a, calls_b = Calls(), Calls()

    def handler_a(message):
        calls_a.add(message.offset)
        effect(message, "A")
        if message.offset == 1:
            raise RuntimeError("retry later")

    def handler_b(message):
        calls_b.add(message.offset)
        effect(message, "B")

    publish_to(TOPIC, 0, 2)
    conf = fast_conf(BACKOFF_MIN=30, BACKOFF_MAX=30)
    with running([spec(TOPIC, GROUP, handler_a, atomic=True)], name="A", conf=conf) as worker_a:
        wait_until(
            lambda: (
                DeliveryState.objects.filter(topic=TOPIC, message_offset=2, acked=True).exists()
                and DeliveryState.objects.filter(topic=TOPIC, message_offset=1, status=RETRY).exists()
            ),
            what="offset 2 acked by A, offset 1 waiting for its retry",
        )
        worker_a.subscriptions[0].held = frozenset()  # keep A from releasing: B must steal
        PartitionLease.objects.filter(leased_by="A").update(leased_by="gone")
    age_lease(GROUP, TOPIC, 0, 60)
    DeliveryState.objects.filter(topic=TOPIC, message_offset=1).update(invisible_until=store().now())
    with running([spec(TOPIC, GROUP, handler_b, atomic=True)], name="B"):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="B caught up")
    assert calls_a.list() == [1, 2]
    assert calls_b.list() == [1]
    assert sorted(Handled.objects.values_list("offset", "worker")) == [(1, "B"), (2, "A")]


# -- publish inside ------------------------------------------------------------------------------


def test_publish_inside_an_atomic_handler_exists_if_and_only_if_the_ack_committed():
    def handler(message):
        effect(message)
        publish(DOWN, {"from": message.offset, "attempt": message.attempt}, key=message.key)
        if message.payload["i"] == 2 and message.attempt == 1:
            raise RuntimeError("publishes, then fails once")
        if message.payload["i"] == 3:
            raise RuntimeError("publishes, then always fails")

    publish_to(TOPIC, 0, 3)
    with running([spec(TOPIC, GROUP, handler, atomic=True, max_attempts=2)]):
        wait_until(lambda: caught_up(GROUP, TOPIC) and dead_letters(DLQ), what="done")
    downstream = sorted((m.payload["from"], m.payload["attempt"]) for m in Message.objects.filter(topic=DOWN))
    assert downstream == [(1, 1), (2, 2)]  # one per committed ack; none from failed attempts
    assert effects() == [(0, 1), (0, 2)]


# -- batch mode ------------------------------------------------------------------------------------


def test_batch_mode_commits_a_whole_batch_in_one_transaction():
    """Each handler call sees the on-commit hooks of the calls before it in its batch still
    pending: they share one transaction, committed once (then every hook runs)."""
    pending, committed = Calls(), Calls()

    def handler(message):
        effect(message)
        pending.add((message.offset, len(connection.run_on_commit)))
        transaction.on_commit(lambda: committed.add(message.offset))

    publish_to(TOPIC, 0, 10)
    with running([spec(TOPIC, GROUP, handler, atomic="batch", batch_size=5)]):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="all acked")
    assert pending.list() == [(o, (o - 1) % 5) for o in range(1, 11)]
    assert sorted(committed.list()) == list(range(1, 11))
    assert effects() == [(0, o) for o in range(1, 11)]


def test_per_message_mode_commits_each_message_alone():
    pending = Calls()

    def handler(message):
        pending.add(len(connection.run_on_commit))
        transaction.on_commit(lambda: None)

    publish_to(TOPIC, 0, 4)
    with running([spec(TOPIC, GROUP, handler, atomic=True, batch_size=4)]):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="all acked")
    assert pending.list() == [0, 0, 0, 0]


def test_a_poison_message_in_batch_mode_is_retried_alone_while_its_batch_mates_commit(caplog):
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    calls = Calls()

    def handler(message):
        calls.add((message.offset, message.attempt))
        effect(message)
        if message.offset == 3:
            raise RuntimeError("poison")

    publish_to(TOPIC, 0, 5)
    with running([spec(TOPIC, GROUP, handler, atomic="batch", batch_size=5, max_attempts=3)]):
        # The batch-mates commit at once (first delivery), before the poison's retries.
        wait_until(lambda: effects() == [(0, 1), (0, 2), (0, 4), (0, 5)], what="batch-mates committed")
        assert row(GROUP, TOPIC, 0, 3).status in (RETRY, IN_FLIGHT)
        wait_until(lambda: caught_up(GROUP, TOPIC) and dead_letters(DLQ), what="poison dead-lettered")
    assert effects() == [(0, 1), (0, 2), (0, 4), (0, 5)]
    assert [a for o, a in calls.list() if o == 3][-1] == 3
    assert records(caplog, "atomic batch rolled back", logging.INFO)


def test_batch_mode_handles_several_partitions_each_in_its_own_transaction():
    publish_to(TOPIC, 1, 3)
    publish_to(TOPIC, 2, 3)
    with running([spec(TOPIC, GROUP, effect, atomic="batch")]):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="all acked")
    assert effects() == [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (2, 3)]


# -- timeouts and the lease keeper ------------------------------------------------------------------


def test_the_watchdog_and_a_commit_exclude_each_other():
    """The progress lock: once abandoned no commit starts; once committing no abandon."""
    progress = BatchProgress(None, [object()], {}, None)
    assert progress.begin(0, 0.0)
    assert progress.abandon(time.monotonic() + 1) is not None
    assert not progress.start_commit()

    progress = BatchProgress(None, [object()], {}, None)
    assert progress.begin(0, 0.0)
    assert progress.start_commit()
    assert progress.abandon(time.monotonic() + 1) is None
    assert progress.record(lambda: None)
    assert progress.begin(0, 0.0)  # running again after the commit


@not_on_sqlite("a hung atomic handler holds SQLite's database write lock, so nothing else could write")
def test_a_timed_out_atomic_handler_that_returns_late_never_commits(caplog):
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    release = threading.Event()
    returned = threading.Event()

    def handler(message):
        effect(message)
        publish(DOWN, {"attempt": message.attempt})
        if message.attempt == 1:
            release.wait(10)
            returned.set()

    publish_to(TOPIC, 0, 1)
    try:
        with running([spec(TOPIC, GROUP, handler, atomic=True, timeout=0.3)], allow_errors=True):
            wait_until(lambda: records(caplog, "handler timed out"), what="the watchdog gave up")
            wait_until(lambda: caught_up(GROUP, TOPIC), what="attempt 2 committed")
            release.set()
            assert returned.wait(10)
            wait_until(lambda: records(caplog, "its transaction rolled back", logging.INFO), what="late rollback")
    finally:
        release.set()
    assert list(Handled.objects.values_list("offset", "attempt")) == [(1, 2)]
    assert [m.payload for m in Message.objects.filter(topic=DOWN)] == [{"attempt": 2}]


@not_on_sqlite("a hung atomic handler holds SQLite's database write lock, so nothing else could write")
def test_a_timed_out_atomic_batch_rolls_back_whole_and_its_messages_commit_once_later(caplog):
    """The watchdog gives a batch up while its second handler hangs: the first message's
    uncommitted work is handed back with the rest, the late thread rolls back, and every
    message ends up committed exactly once."""
    caplog.set_level(logging.INFO, logger="django_sqlqueue")
    release, returned = threading.Event(), threading.Event()

    def handler(message):
        effect(message)
        if message.offset == 2 and message.attempt == 1:
            release.wait(10)
            returned.set()

    publish_to(TOPIC, 0, 3)
    try:
        with running([spec(TOPIC, GROUP, handler, atomic="batch", timeout=0.3)], allow_errors=True):
            wait_until(lambda: records(caplog, "handler timed out"), what="the watchdog gave up")
            wait_until(lambda: caught_up(GROUP, TOPIC), what="all committed")
            release.set()
            assert returned.wait(10)
            wait_until(lambda: records(caplog, "its transaction rolled back", logging.INFO), what="late rollback")
    finally:
        release.set()
    assert effects() == [(0, 1), (0, 2), (0, 3)]
    # Offset 1 was handed back (its attempt not counted); offset 2's hung attempt was.
    assert sorted(Handled.objects.values_list("offset", "attempt")) == [(1, 1), (2, 2), (3, 1)]


@not_on_sqlite("a SQLite transaction holds the database write lock from BEGIN: renewals wait (documented)")
def test_the_lease_keeper_renews_while_an_atomic_handler_is_in_its_transaction():
    inside, release = threading.Event(), threading.Event()
    conf = fast_conf()  # renews every 0.2 s

    def handler(message):
        effect(message)  # the transaction has written: it holds row locks now
        inside.set()
        assert release.wait(10)

    def renewed_at():
        return PartitionLease.objects.get(consumer_group=GROUP, topic=TOPIC, partition=0).lease_renewed_at

    publish_to(TOPIC, 0, 1)
    try:
        with running([spec(TOPIC, GROUP, handler, atomic=True, timeout=None)], conf=conf):
            assert inside.wait(10)
            first = renewed_at()
            # Two renewals' worth of time, at most: the keeper's UPDATE is not blocked.
            wait_until(lambda: renewed_at() > first, timeout=2 * conf.LEASE_RENEW_INTERVAL + 1, what="a renewal")
            assert connection.vendor and not row(GROUP, TOPIC, 0, 1).acked
            release.set()
            wait_until(lambda: caught_up(GROUP, TOPIC), what="acked")
    finally:
        release.set()
    assert effects() == [(0, 1)]


def test_extend_visibility_in_an_atomic_handler_is_written_and_committed_at_once():
    seen = Calls()

    def handler(message):
        before = row(GROUP, TOPIC, 0, 1).invisible_until
        seen.add(message.extend_visibility(600))
        after_on_other_connection = Thread(lambda: row(GROUP, TOPIC, 0, 1).invisible_until)
        after_on_other_connection.start()
        seen.add(after_on_other_connection.join_ok() > before or connection.vendor == "sqlite")

    publish_to(TOPIC, 0, 1)
    with running([spec(TOPIC, GROUP, handler, atomic=True)]):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="acked")
    assert seen.list() == [True, True]


# -- other aliases ------------------------------------------------------------------------------------


@not_on_sqlite("the 'other' alias is a second connection to the same file, which waits for the write lock")
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_write_through_another_alias_is_warned_about_once_per_consumer(caplog):
    caplog.set_level(logging.WARNING, logger="django_sqlqueue")

    def handler(message):
        Handled.objects.using("other").create(
            group=GROUP, topic="elsewhere", partition=0, offset=message.offset, message_id="x", attempt=1, worker="o"
        )
        effect(message)

    publish_to(TOPIC, 0, 3)
    with running([spec(TOPIC, GROUP, handler, atomic=True)]):
        wait_until(lambda: caught_up(GROUP, TOPIC), what="acked")
    warned = records(caplog, "wrote through database alias 'other'")
    assert len(warned) == 1 and "group=g topic=atomic.events" in warned[0].getMessage()
    connections["other"].close()


# -- the django.tasks backend ------------------------------------------------------------------------


def atomic_tasks(atomic):
    from django.conf import settings
    from django.test import override_settings

    from tests.support.task_helpers import FAST_SQLQUEUE
    from tests.support.taskapp.settings_common import TASKS

    options = {**TASKS["default"]["OPTIONS"], "ATOMIC": atomic}
    base = {k: v for k, v in (getattr(settings, "SQLQUEUE", None) or {}).items() if k == "TOPICS"}
    return override_settings(
        TASKS={"default": {**TASKS["default"], "OPTIONS": options}}, SQLQUEUE={**base, **FAST_SQLQUEUE}
    )


def test_tasks_option_atomic_is_validated_per_backend_and_per_queue():
    from django_sqlqueue.tasks.backend import parse_options

    assert parse_options("default", {"ATOMIC": "batch"}).atomic_for_queue("x") == "batch"
    by_queue = parse_options("default", {"ATOMIC": {"default": True}})
    assert (by_queue.atomic_for_queue("default"), by_queue.atomic_for_queue("other")) == (True, False)
    with pytest.raises(ConfigurationError, match=r"\['ATOMIC'\]\['default'\]: atomic must be True, False or 'batch'"):
        parse_options("default", {"ATOMIC": {"default": "always"}})


@pytest.mark.parametrize("mode", [True, "batch"])
def test_a_task_on_an_atomic_queue_commits_its_effects_with_its_result_and_a_failure_leaves_none(mode):
    from django_sqlqueue.tasks.compat import TaskResultStatus
    from django_sqlqueue.tasks.discovery import task_consumer_specs
    from tests.support.task_helpers import running_worker
    from tests.support.task_helpers import wait_until as task_wait
    from tests.support.taskapp import tasks
    from tests.support.taskapp.models import Run

    with atomic_tasks({"default": mode}):
        assert {s.topic: s.atomic for s in task_consumer_specs()} == {"tasks.default": mode, "tasks.other": False}
        ok = tasks.add.enqueue(2, 3)
        bad = tasks.always_fails.enqueue("atomic-fail")
        backend = tasks.add.get_backend()
        with running_worker():
            done = task_wait(lambda: (r := backend.get_result(ok.id)).is_finished and r, 20, "add")
            failed = task_wait(lambda: (r := backend.get_result(bad.id)).is_finished and r, 20, "always_fails")
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert Run.objects.filter(label="add").count() == 1
    # Three attempts, each recorded after its rollback; none of their effects remain.
    assert failed.status == TaskResultStatus.FAILED and len(failed.errors) == 3
    assert "always fails" in failed.errors[-1].traceback
    assert Run.objects.filter(label="atomic-fail").count() == 0


# -- operators' views --------------------------------------------------------------------------------


@pytest.fixture
def declared():
    """A batch-atomic consumer declared (registered) for the duration of the test."""

    def handler(message):
        pass

    consumer(TOPIC, group="shown", atomic="batch")(handler)
    yield
    registry.unregister("shown", TOPIC)


def test_queue_status_lists_the_declared_consumers_and_whether_they_are_atomic(declared):
    from io import StringIO

    from django.core.management import call_command

    from django_sqlqueue.ops.status import queue_status

    assert [(c.group, c.topic, c.atomic) for c in queue_status().atomic_consumers] == [("shown", TOPIC, "per batch")]
    out = StringIO()
    call_command("queue_status", stdout=out)
    line = next(line for line in out.getvalue().splitlines() if line.startswith("shown "))
    assert line.split() == ["shown", TOPIC, "per", "batch"]


def test_the_console_overview_and_group_page_show_whether_a_consumer_is_atomic(declared, admin_client):
    from django_sqlqueue import ops

    publish_to(TOPIC, 0, 1)
    store().ensure_offsets("shown", TOPIC, [0])
    row_ = next(g for g in ops.overview().groups if g.group == "shown")
    assert row_.atomic == "per batch"
    assert ops.consumer_atomic("shown", TOPIC) == "per batch" and ops.consumer_atomic("nobody", TOPIC) == ""
    from django.urls import reverse

    page = admin_client.get(reverse("admin:django_sqlqueue_queueconsole_overview")).content.decode()
    assert "<td>per batch</td>" in page
    group_url = reverse("admin:django_sqlqueue_queueconsole_group", args=["shown", TOPIC])
    assert "atomic: per batch" in admin_client.get(group_url).content.decode()
