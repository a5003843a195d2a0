"""One poll of one subscription (django_sqlqueue/worker/poller.py) and where its batches run
(django_sqlqueue/worker/dispatch.py), against the real database.

The first test builds a poller from its parts, without a Worker: a real subscription
leased by a real keeper round, a real batch runner and the inline dispatch. The others
build a Worker (not run) and check the strategy it chose when it was built: the poller is
wired from the start, and handler threads start only when asked.
"""

from __future__ import annotations

import threading

import pytest

from django_sqlqueue.db.retry import Retrying
from django_sqlqueue.db.sequencer import Sequencer
from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.worker.batch.handlers import HandlerRunner
from django_sqlqueue.worker.batch.outcomes import Stats
from django_sqlqueue.worker.batch.runner import BatchRunner
from django_sqlqueue.worker.dispatch import HandlerPool, Inline, OneHandlerThread
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.poller import Poller
from django_sqlqueue.worker.subscription import Subscription
from django_sqlqueue.worker.threads.leasing import LeaseKeeper

from ..support.engine_helpers import Calls, delivery_rows, fast_conf, publish_to, spec, store, wait_until, watermark

pytestmark = pytest.mark.django_db(transaction=True)


def noop(message: object) -> None:
    pass


def handler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("sqlqueue-handler")]


def test_a_poll_of_a_real_subscription_delivers_a_batch_and_writes_its_outcomes():
    topic = "poller.one"
    conf = fast_conf()
    calls = Calls()
    sub = Subscription.create(spec(topic, "g", lambda m: calls.add((m.partition, m.offset, m.attempt))), "p1", conf)
    queue = store()
    queue.register_topic(topic, conf.partitions_for(topic))
    LeaseKeeper([sub], queue, conf).rebalance(sub)
    publish_to(topic, 2, 3)
    stop = threading.Event()
    db = Retrying(queue.using, stop)
    runner = BatchRunner(queue, conf, stats=Stats(), stop_event=stop, db=db)
    invoke = HandlerRunner()
    poller = Poller(queue, Sequencer(queue.using), conf, db=db, dispatch=Inline(runner, invoke))
    try:
        assert poller.poll(sub) == (3, False)
        assert calls.list() == [(2, 1, 1), (2, 2, 1), (2, 3, 1)]  # on this thread, in offset order
        assert watermark("g", topic, 2) == 3 and delivery_rows("g", topic) == []  # acked
        assert poller.poll(sub) == (0, False)  # nothing left
    finally:
        invoke.close()


@pytest.mark.parametrize(
    ("options", "concurrency", "inline", "kind"),
    [
        ({"timeout": None}, 1, False, Inline),  # no handler timeout: the poll loop's thread
        ({}, 1, False, OneHandlerThread),  # the default timeout: one handler thread
        ({"timeout": None}, 3, False, HandlerPool),  # --concurrency 3
        ({}, 1, True, Inline),  # the testing helpers' drain: on the calling thread
    ],
)
def test_the_worker_chooses_where_batches_run_when_it_is_built(options, concurrency, inline, kind):
    before = handler_threads()
    worker = Worker(
        [spec("poller.kind", "g", noop, **options)],
        name="p-kind",
        conf=fast_conf(NOTIFY=False),
        concurrency=concurrency,
        inline=inline,
    )
    assert type(worker.dispatch) is kind
    assert worker.poller.dispatch is worker.dispatch and worker.poller.batches is worker.batches
    assert worker.uses_handler_threads == (kind is not Inline)
    assert (worker.executor is None) == (worker.watchdog is None) == (kind is Inline)
    assert handler_threads() == before  # built, not started: run() starts them
    if worker.executor is not None:
        assert worker.executor.concurrency == concurrency and worker.executor.free == concurrency


def test_an_inline_worker_has_no_listener_and_one_batch_at_a_time():
    worker = Worker([spec("poller.inline", "g", noop)], name="p-inline", conf=fast_conf(NOTIFY=True), inline=True)
    assert worker.listener is None and worker.services == [worker.keeper]
    with pytest.raises(ConfigurationError, match="inline"):
        Worker([spec("poller.inline", "g", noop)], name="p-inline", inline=True, concurrency=2)


def test_a_worker_builds_its_batch_runner_with_the_factory_it_is_given():
    built: list[BatchRunner] = []

    def factory(*args, **kwargs) -> BatchRunner:
        built.append(BatchRunner(*args, **kwargs))
        return built[-1]

    worker = Worker([spec("poller.factory", "g", noop)], name="p-factory", conf=fast_conf(), batches=factory)
    assert built == [worker.batches] and worker.dispatch.batches is worker.batches
    assert worker.batches.stop_event is worker.stop_event and worker.batches.stats is worker.stats


def test_one_handler_thread_runs_the_poll_while_the_poll_waits_for_it():
    topic = "poller.thread"
    seen: list[str] = []
    worker = Worker([spec(topic, "g", lambda m: seen.append(threading.current_thread().name))], name="p-thread")
    worker.register_topics()
    sub = worker.subscriptions[0]
    worker.keeper.rebalance(sub)
    publish_to(topic, 0, 2)
    worker.dispatch.start()
    try:
        assert worker.poll(sub) == (2, False)
        # Returned once the batch was written: the poll loop waited, watching its timeout.
        assert watermark("g", topic, 0) == 2 and not sub.in_flight.snapshot()
        assert len(seen) == 2 and all(name.startswith("sqlqueue-handler") for name in seen)
    finally:
        worker.dispatch.drain()
        worker.keeper.release_all()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_before_run_a_threaded_worker_polls_inline_on_the_calling_thread(concurrency: int):
    """``Worker.poll()`` without ``run()`` (benchmarks, tests) runs the batches on the calling
    thread, as it always did: no handler thread was started, so none may be waited for."""
    topic = f"poller.before{concurrency}"
    seen: list[str] = []
    worker = Worker(
        [spec(topic, "g", lambda m: seen.append(threading.current_thread().name))],
        name=f"p-before{concurrency}",
        concurrency=concurrency,
    )
    assert isinstance(worker.dispatch, (OneHandlerThread, HandlerPool))
    worker.register_topics()
    sub = worker.subscriptions[0]
    worker.keeper.rebalance(sub)
    publish_to(topic, 0, 2)
    try:
        assert worker.poll(sub)[0] == 2
        assert seen == [threading.current_thread().name] * 2
        assert watermark("g", topic, 0) == 2 and handler_threads() == []
    finally:
        worker.keeper.release_all()


def test_a_pool_fetches_no_more_partitions_than_threads_are_free():
    topic = "poller.pool"
    release = threading.Event()
    calls = Calls()

    def hold(message: object) -> None:
        calls.add(message)
        release.wait(10)

    worker = Worker([spec(topic, "g", hold, timeout=None)], name="p-pool", conf=fast_conf(), concurrency=2)
    worker.register_topics()
    sub = worker.subscriptions[0]
    worker.keeper.rebalance(sub)
    for partition in (1, 4, 6):
        publish_to(topic, partition, 1)
    worker.dispatch.start()
    try:
        assert worker.poll(sub) == (2, False)  # handed out: one partition per free thread
        busy = sub.in_flight.snapshot()
        assert len(busy) == 2 and busy <= {1, 4, 6}
        wait_until(lambda: len(calls) == 2, what="both handler threads to start")
        assert worker.dispatch.saturated and worker.poll(sub) == (0, False)  # no thread free
        release.set()
        wait_until(lambda: not sub.in_flight.snapshot(), what="the batches to finish")
        assert worker.poll(sub) == (1, False)  # the third partition's turn
        wait_until(lambda: all(watermark("g", topic, p) == 1 for p in (1, 4, 6)), what="all acked")
    finally:
        release.set()
        worker.dispatch.drain()
        worker.keeper.release_all()
