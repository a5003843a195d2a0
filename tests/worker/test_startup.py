"""What a worker does once before its first poll (django_sqlqueue/worker/startup.py).

Real database throughout; the outage is a real one: a TCP proxy in front of the server
(tests/support/tcpproxy.py) refuses connections until the test restores it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from django_sqlqueue import publish
from django_sqlqueue.db.retry import Retrying
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.models import Message, Partition, Topic
from django_sqlqueue.worker import startup
from django_sqlqueue.worker.budget import ConnectionBudget
from django_sqlqueue.worker.loop import Worker
from django_sqlqueue.worker.outage import OutageReporter
from tests.support.tcpproxy import TcpProxy

from ..support.engine_helpers import fast_conf, not_on_sqlite, running, spec, store, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

STARTUP_LOGGER = "django_sqlqueue.worker.startup"


def registered(topic: str) -> int | None:
    row = Topic.objects.filter(topic=topic).first()
    return None if row is None else row.partitions


def test_register_topics_registers_each_topic_once_with_its_count_and_refuses_another():
    conf = fast_conf(TOPICS={"st.a": {"partitions": 3}, "st.b": {"partitions": 5}})
    stop = threading.Event()
    startup.register_topics(store(), conf, Retrying("default", stop), ["st.b", "st.a", "st.b"])
    assert (registered("st.a"), registered("st.b")) == (3, 5)
    assert Partition.objects.filter(topic="st.b").count() == 5
    other = fast_conf(TOPICS={"st.a": {"partitions": 4}})
    with pytest.raises(ConfigurationError, match=r"'st.a' is registered with 3 partitions.*gives it 4 partitions"):
        startup.register_topics(store(), other, Retrying("default", stop), ["st.a"])
    assert registered("st.a") == 3  # refused, not changed


def test_a_worker_stopped_before_it_got_in_registers_nothing():
    stop = threading.Event()
    stop.set()
    outage = OutageReporter(alias="default", report_interval=60)
    started = startup.register_when_reachable(
        store(), fast_conf(), Retrying("default", stop), ["st.never"], stop_event=stop, outage=outage
    )
    assert started is False and registered("st.never") is None
    worker = Worker([spec("st.never", "g", print)], name="st-stopped", conf=fast_conf(NOTIFY=False))
    worker.stop()
    worker.run()  # returns at once: nothing registered, no thread started
    assert registered("st.never") is None and not worker.keeper.is_alive()


@pytest.fixture
def proxied_alias() -> Iterator[tuple[str, TcpProxy]]:
    """An alias of the test database reached through a proxy the test can cut."""
    s = connection.settings_dict
    default_port = {"mysql": 3306, "postgresql": 5432}[connection.vendor]
    proxy = TcpProxy(s["HOST"] or "127.0.0.1", int(s["PORT"] or default_port))
    alias = "startup-proxied"
    connections[alias] = type(connections["default"])({**s, "HOST": "127.0.0.1", "PORT": str(proxy.port)}, alias=alias)
    try:
        yield alias, proxy
    finally:
        connections[alias].close()
        del connections[alias]
        proxy.close()


@not_on_sqlite("an outage is a database server going away; SQLite is a file in the process")
def test_a_worker_started_during_an_outage_registers_once_the_database_is_back(proxied_alias, caplog):
    alias, proxy = proxied_alias
    proxy.cut()
    stop = threading.Event()
    outage = OutageReporter(alias=alias, report_interval=60)

    def restore_once_reported() -> None:
        # Past its retries, the start is an outage (one line); the server comes back.
        wait_until(lambda: outage.in_outage or stop.is_set(), 20, "the outage to be reported")
        proxy.restore()

    back = threading.Thread(target=restore_once_reported)
    back.start()
    try:
        started = startup.register_when_reachable(
            QueueStore(alias), fast_conf(), Retrying(alias, stop), ["st.outage"], stop_event=stop, outage=outage
        )
    finally:
        stop.set()
        back.join(20)
    assert started is True and registered("st.outage") == 8
    assert outage.outages == 1 and not outage.in_outage  # reported as an outage, then over
    assert not [r for r in caplog.records if r.exc_info], "an outage is a few lines, not a traceback"


def test_the_room_check_warns_when_the_server_cannot_take_the_budget(caplog):
    caplog.set_level(logging.DEBUG, logger=STARTUP_LOGGER)
    huge = ConnectionBudget(handler_threads=1_000_000)
    startup.check_connection_room(store(), huge, name="st-room")
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == STARTUP_LOGGER]
    if connection.vendor == "sqlite":
        assert lines == [(logging.DEBUG, "no connection limit to check (sqlite) alias=default")]
        return
    ((level, message),) = lines
    assert level == logging.WARNING and "max_connections" in message
    assert message.endswith("connections of this worker: poll loop 1 + lease keeper 1 + handler threads 1000000 "
                            "= 1000002 subscriber=st-room")  # fmt: skip
    caplog.clear()
    startup.check_connection_room(store(), ConnectionBudget(), name="st-room")
    assert [r.levelno for r in caplog.records if r.name == STARTUP_LOGGER] == [logging.DEBUG]


class AsyncCallable:
    async def __call__(self, message: object) -> None:
        pass


async def async_handler(message: object) -> None:
    pass


def test_async_handlers_are_recognised_functions_and_callables_alike():
    assert startup.is_async(async_handler) and startup.is_async(AsyncCallable())
    assert not startup.is_async(print) and not startup.is_async(lambda m: None)


def unreached_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STARTUP_LOGGER and r.levelno == logging.WARNING]


def test_a_consumed_topic_no_message_reached_is_one_warning_with_the_nearest_topics(caplog):
    """Issue 29: a worker consuming ``order.created`` for ``orders.created`` leased 8 partitions
    of a topic that never gets a message, without a word."""
    publish("st.orders.created", {"n": 1})
    consumed = [("billing", "st.order.created"), ("audit", "st.order.created"), ("billing", "st.orders.created")]
    startup.warn_unreached_topics(store(), fast_conf(), consumed)
    (line,) = unreached_warnings(caplog)
    assert line == (
        "topic 'st.order.created' (consumed by audit, billing) has never had a message and is not declared in "
        "SQLQUEUE['TOPICS']; nearest known topics: st.orders.created -- a typo in @consumer(...)? (a new topic: "
        "declare it in SQLQUEUE['TOPICS'] to silence this; sqlqueue.W003)"
    )


def test_declared_dead_letter_and_collected_topics_are_not_warned_about(caplog):
    conf = fast_conf(TOPICS={"st.declared": {"partitions": 2}})
    # Handled and collected (RETENTION 0): the log is empty, the partition's head is not.
    startup.register_topics(store(), conf, Retrying("default", threading.Event()), ["st.collected"])
    publish("st.collected", {"n": 1})
    sequence("st.collected")
    Message.objects.filter(topic="st.collected").delete()
    consumed = [("g", "st.declared"), ("g", "st.collected"), ("g", "st.collected_dlq")]
    startup.warn_unreached_topics(store(), conf, consumed)
    assert unreached_warnings(caplog) == []


def test_a_worker_says_so_when_it_starts(caplog):
    publish("st.order.created", {"n": 1})
    with running([spec("st.ordr.created", "g", print)], name="st-typo", conf=fast_conf(NOTIFY=False)):
        wait_until(lambda: unreached_warnings(caplog), 10, "the warning")
    (line,) = unreached_warnings(caplog)
    assert line.startswith("topic 'st.ordr.created' (consumed by g) has never had a message")
