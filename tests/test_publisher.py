"""publish() and publish_many(): the append-only transactional outbox, idempotency, batching."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import DatabaseError, connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import publish, publish_many
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.exceptions import (
    ConfigurationError,
    IdempotencyConflict,
    InvalidMessage,
    NotInstalled,
    OutboxWarning,
    PayloadTooLarge,
    QueueTablesMissing,
    SQLQueueError,
)
from django_sqlqueue.models import Message, Partition
from django_sqlqueue.rules.partitioning import partition_for

from .support.engine_helpers import not_on_sqlite

pytestmark = pytest.mark.django_db(transaction=True)


def committed_count(spawn, **filters) -> int:
    """Count rows from another connection: what other transactions can see."""
    return spawn(lambda: Message.objects.filter(**filters).count()).join_ok()


def test_publish_appends_one_row_without_offset():
    message = publish("orders.created", {"order": 1, "total": Decimal("9.50")}, key="alice")
    assert message.topic == "orders.created" and message.key == "alice" and message.created
    assert message.partition == partition_for("alice", 8)
    stored = Message.objects.get()
    assert (stored.topic, stored.key, stored.partition, stored.id) == (
        "orders.created",
        "alice",
        message.partition,
        message.id,
    )
    assert len(message.id) == 32
    assert stored.payload == {"order": 1, "total": "9.50"}  # Decimal is stored as a string
    assert stored.offset is None  # numbered after commit, by the sequencer
    assert stored.created_at == stored.published_at == stored.deliver_at
    assert stored.failed_at is None and stored.failure_count == 0 and stored.original_topic == ""
    assert not Partition.objects.exists()  # publishers never touch head rows
    assert sequence("orders.created") == {message.partition: 1}
    assert Message.objects.get().offset == 1


def test_publish_outside_transaction_autocommits(spawn):
    assert connection.get_autocommit()
    message = publish("t", {"x": 1})
    assert committed_count(spawn, id=message.id) == 1


def test_publish_in_committed_atomic_leaves_exactly_one_row(spawn):
    with transaction.atomic():
        publish("t", {"x": 1}, key="p")
        assert committed_count(spawn, topic="t") == 0  # not visible before the caller commits
    assert committed_count(spawn, topic="t") == 1


def test_publish_in_rolled_back_atomic_leaves_nothing(spawn):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with transaction.atomic():
            publish("t", {"x": 1}, key="p")
            publish_many("t", [{"payload": i, "key": "q"} for i in range(5)])
            raise Boom
    assert committed_count(spawn) == 0


def test_publish_in_rolled_back_savepoint_keeps_outer_work():
    with transaction.atomic():
        publish("t", 1, key="p")
        try:
            with transaction.atomic():
                publish("t", 2, key="p")
                raise RuntimeError("inner")
        except RuntimeError:
            pass
        publish("t", 3, key="p")
    sequence("t")
    assert list(Message.objects.order_by("offset").values_list("offset", "payload")) == [(1, 1), (2, 3)]


def test_keys_accept_str_int_and_uuid_and_ids_too():
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    a = publish("t", 1, key=42, id=u)
    assert a.key == "42" and a.id == str(u) and a.partition == partition_for("42", 8)
    b = publish("t", 2, key=u, id=7)
    assert b.key == str(u) and b.id == "7"
    with pytest.raises(InvalidMessage, match="key must be a str, int or UUID, got float"):
        publish("t", 3, key=1.5)
    with pytest.raises(InvalidMessage, match="id must be a str, int or UUID, got bool"):
        publish("t", 3, id=True)
    assert Message.objects.count() == 2


def test_republishing_an_id_with_the_same_payload_stores_nothing():
    first = publish("t", {"v": 1}, key="p", id="evt-1")
    again = publish("t", {"v": 1}, key="p", id="evt-1")
    assert first.created and not again.created
    assert again.partition == first.partition
    assert Message.objects.count() == 1
    # The same id in another topic is another message.
    assert publish("u", {"v": 1}, key="p", id="evt-1").created
    assert Message.objects.count() == 2


def test_republishing_an_id_with_another_payload_or_key_is_an_error_and_writes_nothing():
    publish("t", {"v": 1}, key="p", id="evt-1")
    with pytest.raises(IdempotencyConflict, match=r"'evt-1'.*different payload"):
        publish("t", {"v": 2}, key="p", id="evt-1")
    with pytest.raises(IdempotencyConflict, match="different key"):
        publish("t", {"v": 1}, key="other", id="evt-1")
    with pytest.raises(IdempotencyConflict):
        publish_many("t", [{"payload": "fresh", "id": "new-1"}, {"payload": {"v": 9}, "key": "p", "id": "evt-1"}])
    assert list(Message.objects.values_list("id", flat=True)) == ["evt-1"]  # nothing of the batch


def test_republish_inside_same_transaction_and_same_batch():
    with transaction.atomic():
        first = publish("t", 1, id=7)
        again = publish("t", 1, id="7")  # ints are ids too, compared as strings
    assert first.created and not again.created and Message.objects.count() == 1
    messages = publish_many("t", [{"payload": "x", "id": "b"}, {"payload": "x", "id": "b"}])
    assert [m.id for m in messages] == ["b", "b"] and Message.objects.count() == 2
    with pytest.raises(IdempotencyConflict):
        publish_many("t", [{"payload": "x", "id": "c"}, {"payload": "y", "id": "c"}])


def test_concurrent_publishers_of_the_same_id_store_it_once(spawn):
    """The second waits on the unique index for the first, then skips the row, without an error."""
    import threading

    inserted, release = threading.Event(), threading.Event()

    def first():
        with transaction.atomic():
            message = publish("t", {"v": 1}, id="same")
            inserted.set()
            assert release.wait(10)
        return message

    a = spawn(first)
    assert inserted.wait(10)

    def second():
        with transaction.atomic():
            message = publish("t", {"v": 1}, id="same")
            publish("t", {"v": 2}, id="after")  # the transaction is still usable
        return message

    b = spawn(second)
    b.join(0.5)
    assert b.is_alive(), "uniqueness of one id makes the second publisher wait"
    release.set()
    assert a.join_ok().created
    assert not b.join_ok().created
    assert sorted(Message.objects.values_list("id", flat=True)) == ["after", "same"]


def test_publish_many_keeps_input_order_per_key():
    items = [{"payload": i, "key": f"k{i % 3}", "metadata": {"i": i}} for i in range(30)]
    messages = publish_many("batch", items)
    assert [m.key for m in messages] == [f"k{i % 3}" for i in range(30)]
    sequence("batch")
    for key in ("k0", "k1", "k2"):
        stored = list(Message.objects.filter(key=key).order_by("offset").values_list("payload", flat=True))
        assert stored == [i for i in range(30) if i % 3 == int(key[1])]


def test_publish_many_large_batch_spans_statements_and_offsets_are_dense():
    messages = publish_many("big", ({"payload": {"n": i}, "key": f"p{i % 7}"} for i in range(3000)))
    assert len(messages) == 3000 == Message.objects.filter(topic="big").count()
    heads = sequence("big")
    for partition, head in heads.items():
        offsets = list(
            Message.objects.filter(topic="big", partition=partition).order_by("offset").values_list("offset", flat=True)
        )
        assert offsets == list(range(1, head + 1))
    assert sum(heads.values()) == 3000


def test_unkeyed_messages_spread_over_partitions():
    publish_many("spread", [{"payload": i} for i in range(80)])
    partitions = set(Message.objects.filter(topic="spread").values_list("partition", flat=True))
    assert partitions == set(range(8))


def test_partition_count_per_topic_and_per_key_topics():
    with override_settings(
        SQLQUEUE={"PARTITIONS": 4, "TOPICS": {"wide": {"partitions": 64}, "few": {"per_key": True}}}
    ):
        assert publish("default.count", 1, key="hello").partition == partition_for("hello", 4)
        assert publish("wide", 1, key="hello").partition == partition_for("hello", 64)
        assert publish("few", 1, key="hello").partition == partition_for("hello", None) == 907060870


def test_publish_many_empty_is_noop():
    assert publish_many("t", []) == []
    assert not Message.objects.exists()


def test_delay_uses_database_clock():
    publish("t", "later", delay=60, id="d1")
    publish("t", "later-td", delay=dt.timedelta(minutes=2), id="d2")
    d1, d2 = Message.objects.get(id="d1"), Message.objects.get(id="d2")
    assert d1.deliver_at - d1.published_at == dt.timedelta(seconds=60)
    assert d2.deliver_at - d2.published_at == dt.timedelta(minutes=2)


def test_deliver_at_absolute_time():
    when = timezone.now() + dt.timedelta(hours=1)
    publish("t", "x", deliver_at=when, id="a")
    other_tz = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    publish("t", "y", deliver_at=other_tz, id="b")
    assert Message.objects.get(id="a").deliver_at == when
    assert Message.objects.get(id="b").deliver_at == other_tz


def test_ids_compare_exactly():
    # MySQL's default collation would fold these into one id.
    for i, message_id in enumerate(["Key", "key", "kéy"]):
        publish("t", i, id=message_id)
    assert Message.objects.filter(topic="t").count() == 3


def test_unknown_database_alias_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match=r"database alias 'nope' is not in settings\.DATABASES"):
        publish("t", 1, using="nope")
    with pytest.raises(ConfigurationError, match="'nope'"):
        publish_many("t", [{"payload": 1}], using="nope")


@pytest.mark.skipif(connection.vendor != "mysql", reason="max_allowed_packet is a MySQL/MariaDB server limit")
def test_payload_over_max_allowed_packet_is_refused_before_writing():
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@max_allowed_packet")
        packet = int(cursor.fetchone()[0])
    big = "x" * (packet + 1024)
    with override_settings(SQLQUEUE={"MAX_PAYLOAD_BYTES": packet * 4}):
        with transaction.atomic():
            publish("t", "kept", id="kept")
            with pytest.raises(PayloadTooLarge, match="max_allowed_packet"):
                publish("t", big)
            publish("t", "also kept", id="also")  # the connection and the transaction survive
    assert sorted(Message.objects.values_list("id", flat=True)) == ["also", "kept"]


@not_on_sqlite("an open transaction on the other alias holds SQLite's only write lock")
@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_publish_outside_the_callers_transaction_alias_warns():
    """atomic() on another alias: the publish commits on its own, and says so."""
    other = connections["other"]
    with transaction.atomic(using="other"):
        with pytest.warns(OutboxWarning, match="'default'.*not in a transaction.*'other'") as caught:
            publish("t", 1)
        with pytest.warns(OutboxWarning) as caught_many:
            publish_many("t", [{"payload": 1}, {"payload": 2}])
    assert other.in_atomic_block is False
    # The warning points at the line that published (not inside the package).
    assert [w.filename for w in (*caught, *caught_many)] == [__file__, __file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with transaction.atomic():
            publish("t", 2)  # the right alias: no warning
        publish("t", 3)  # no transaction anywhere: no warning


@pytest.mark.django_db(transaction=True)
def test_publish_message_announces_each_stored_message_once_on_commit():
    """publisher.publish_message (publish()'s body): message_published on commit, with the
    decoded JSON; nothing for a rolled-back publish or a re-publish that stored nothing."""
    from django_sqlqueue import signals
    from django_sqlqueue.publisher import publish_message

    sent = []

    def receiver(sender, message, payload, metadata, **kwargs):
        sent.append((sender, message.id, message.created, payload, metadata))

    signals.message_published.connect(receiver)
    try:
        with transaction.atomic():
            first = publish_message("pub.t", {"total": Decimal("1.50")}, id="m1", metadata={"by": "x"})
            assert first.created and sent == []  # not before the commit
        assert sent == [("pub.t", "m1", True, {"total": "1.50"}, {"by": "x"})]
        assert publish_message("pub.t", {"total": Decimal("1.50")}, id="m1").created is False
        with pytest.raises(RuntimeError), transaction.atomic():
            publish_message("pub.t", {}, id="m2")
            raise RuntimeError("rolled back")
    finally:
        signals.message_published.disconnect(receiver)
    assert len(sent) == 1 and not Message.objects.filter(id="m2").exists()


# -- publish() where the queue's tables are not (issue 29) -----------------------------------

ROOT = Path(__file__).resolve().parents[1]
FRESH = "fresh"


@pytest.fixture
def fresh_alias(settings, tmp_path: Path) -> Iterator[str]:
    """An alias of a database on the suite's server without the queue's tables: a new SQLite
    file, a new PostgreSQL schema (its search_path) or a new MySQL/MariaDB database."""
    base = connections["default"].settings_dict
    vendor, name = connection.vendor, f"{base['NAME']}_fresh".rsplit("/", 1)[-1]
    config = {**base, "NAME": str(tmp_path / "fresh.sqlite3")} if vendor == "sqlite" else dict(base)
    if vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
        config["OPTIONS"] = {**base["OPTIONS"], "options": f"-c search_path={name}"}
    elif vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        config["NAME"] = name
    connections[FRESH] = type(connections["default"])(config, alias=FRESH)
    settings.DATABASES = {**settings.DATABASES, FRESH: config}
    try:
        yield FRESH
    finally:
        connections[FRESH].close()
        del connections[FRESH]
        if vendor != "sqlite":
            with connection.cursor() as cursor:
                cursor.execute(f"DROP {'SCHEMA' if vendor == 'postgresql' else 'DATABASE'} IF EXISTS {name}")


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_publish_on_a_database_without_the_migrations_says_to_migrate_it(fresh_alias):
    """Issue 29: a raw 'relation "queue_messages" does not exist' on a fresh database."""
    migrate = f"run `manage.py migrate django_sqlqueue --database {fresh_alias}`"
    with routed_to(fresh_alias):
        with pytest.raises(
            QueueTablesMissing, match=f"missing or out of date on database 'fresh'.*{migrate}"
        ) as caught:
            publish("pub.fresh", 1)
        assert "\n" not in str(caught.value) and "queue_messages" in str(caught.value)
        assert isinstance(caught.value, SQLQueueError) and isinstance(caught.value.__cause__, DatabaseError)
        with pytest.raises(QueueTablesMissing, match=migrate):
            publish_many("pub.fresh", [{"payload": 1}, {"payload": 2, "id": "two"}], using=fresh_alias)
    assert publish("pub.fresh", 1).created  # the queue's own database is migrated


def routed_to(alias: str) -> override_settings:
    """Route the topic pub.fresh to ``alias`` (issue 32: a publish goes to its topic's database)."""
    return override_settings(SQLQUEUE={**django_settings.SQLQUEUE, "TOPIC_DATABASES": {"pub.fresh": alias}})


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_publish_without_the_app_installed_says_to_install_it(fresh_alias):
    apps_without = [app for app in django_settings.INSTALLED_APPS if app != "django_sqlqueue"]
    with override_settings(INSTALLED_APPS=apps_without), routed_to(fresh_alias):
        with pytest.raises(NotInstalled, match=r"'django_sqlqueue' is not in INSTALLED_APPS.*add it to INSTALLED_APPS"):
            publish("pub.fresh", 1)
        with pytest.raises(NotInstalled, match=r"then run `manage\.py migrate django_sqlqueue --database fresh`"):
            publish_many("pub.fresh", [{"payload": 1}], using=fresh_alias)


def test_other_database_errors_are_not_taken_for_missing_tables():
    from django_sqlqueue.publisher import _raise_if_tables_missing

    unique = 'duplicate key value violates unique constraint "queue_messages_topic_id_uniq"'
    _raise_if_tables_missing(DatabaseError(unique), "default")  # returns: the caller re-raises it
    with pytest.raises(QueueTablesMissing):
        _raise_if_tables_missing(DatabaseError("no such table: queue_messages"), "default")


IMPORT_WITHOUT_THE_APP = """
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
)
django.setup()
from django_sqlqueue import publish
"""


def test_importing_publish_without_the_app_installed_says_to_install_it():
    """Without the app, Django refuses to load the models the publisher writes with; the
    last line of the traceback says what to do."""
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_WITHOUT_THE_APP], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "django_sqlqueue.exceptions.NotInstalled: 'django_sqlqueue' is not in INSTALLED_APPS: add it there "
        "(then run `manage.py migrate django_sqlqueue`) to publish."
    )
