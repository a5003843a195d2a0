"""spark/databases.py: each read and write uses the database of its topics, or option ``using``.

The ``second_routes`` fixture routes ``second.*`` to the alias ``second`` (a database of its own). The
reads and the bulk write below run in Spark's Python workers, which know the databases
only through the options of ``sqlqueue_options()``.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
from django.db import connections
from django.utils import timezone

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.models import Message
from django_sqlqueue.publisher import publish_many
from django_sqlqueue.spark import sqlqueue_options
from django_sqlqueue.spark.databases import choose_database, chosen_alias, topic_databases, with_database
from django_sqlqueue.spark.frames import load_messages
from django_sqlqueue.spark.options import SparkOptionError
from django_sqlqueue.spark.pipelines import replay_to_group

from .helpers import reader, run_to_parquet, stream

pytestmark = [
    pytest.mark.django_db(databases=["default", "second"], transaction=True),
    pytest.mark.usefixtures("second_routes"),  # second.* in the alias "second" (tests/conftest.py)
]

ROUTED = "second.orders"
PLAIN = "first.orders"


def topics_in(alias: str) -> list[str]:
    return sorted(set(Message.objects.using(alias).values_list("topic", flat=True)))


def publish_to(topic: str, count: int, prefix: str) -> None:
    """Publish ``count`` messages; publish() writes them to the topic's database."""
    publish_many(topic, [{"payload": {"n": i}, "key": f"k{i % 3}", "id": f"{prefix}{i}"} for i in range(count)])


def test_the_options_hold_every_database_of_the_queue_and_their_passwords_apart() -> None:
    options = sqlqueue_options()
    databases = json.loads(options["databases"])
    assert sorted(databases) == ["default", "second"]
    for alias in ("default", "second"):
        assert databases[alias]["database"] == connections[alias].settings_dict["NAME"]
        assert "password" not in databases[alias]  # in option "passwords", which Spark redacts
    assert sorted(json.loads(options["passwords"])) == ["default", "second"]
    assert "using" not in options  # each use follows its topics' routes
    assert options["database"] == connections["default"].settings_dict["NAME"]
    named = sqlqueue_options("second")
    assert named["using"] == "second" and named["database"] == connections["second"].settings_dict["NAME"]
    with pytest.raises(ConfigurationError, match=r"database alias 'nope' is not in settings\.DATABASES"):
        sqlqueue_options("nope")


def test_a_use_takes_its_topics_database_or_the_one_named_by_using() -> None:
    options = sqlqueue_options()
    second_name = connections["second"].settings_dict["NAME"]
    assert choose_database(options, [ROUTED], "batch read")["database"] == second_name
    assert choose_database(options, [f"{ROUTED}.dlq"], "batch read")["using"] == "second"  # lives with its topic
    assert choose_database(options, [PLAIN], "write")["using"] == "default"
    assert choose_database({**options, "using": "second"}, [PLAIN], "write")["database"] == second_name
    assert topic_databases(options, [PLAIN, ROUTED, "second.x"]) == {"default": [PLAIN], "second": [ROUTED, "second.x"]}
    assert chosen_alias(options, [ROUTED], "default") == "second"
    assert with_database(options, "second")["using"] == "second"
    # Options built by hand (one connection, no "databases") keep their connection.
    by_hand = {k: v for k, v in options.items() if k not in ("databases", "passwords")}
    assert choose_database(by_hand, [ROUTED], "batch read") == by_hand
    assert with_database(by_hand, "second") == by_hand


def test_a_mix_of_databases_an_unknown_alias_and_an_unroutable_pattern_are_refused() -> None:
    options = sqlqueue_options()
    with pytest.raises(SparkOptionError, match=r"topics live in different databases .*'first.orders' in 'default'"):
        choose_database(options, [PLAIN, ROUTED], "batch read")
    with pytest.raises(SparkOptionError, match=r"database alias 'orders' is not one the options hold \(default, s"):
        choose_database({**options, "using": "orders"}, [PLAIN], "write")
    with pytest.raises(SparkOptionError, match=r"'subscribePattern' .* name the database with option 'using'"):
        choose_database(options, [], "stream read")
    assert choose_database({**options, "using": "second"}, [], "stream read")["using"] == "second"
    with pytest.raises(SparkOptionError, match=r"option 'database' is the connection's database name"):
        choose_database({**options, "database": "second"}, [ROUTED], "batch read")
    by_hand = {k: v for k, v in options.items() if k not in ("databases", "passwords")}
    with pytest.raises(SparkOptionError, match=r"option 'using' \('second'\) needs the options of"):
        choose_database({**by_hand, "using": "second"}, [ROUTED], "batch read")


def test_spark_reads_a_routed_topic_from_its_database(spark) -> None:
    publish_to(ROUTED, 40, "r")
    publish_to(PLAIN, 5, "p")
    sequence(ROUTED, using="second")
    assert topics_in("second") == [ROUTED] and topics_in("default") == [PLAIN]

    rows = reader(spark, sqlqueue_options(), ROUTED, rowsPerSplit="7").collect()
    assert sorted(r.id for r in rows) == sorted(f"r{i}" for i in range(40))
    stored = {m.id: (m.partition, m.offset) for m in Message.objects.using("second").filter(topic=ROUTED)}
    assert {r.id: (r.partition, r.offset) for r in rows} == stored
    # Named explicitly: the default database holds no such topic.
    assert reader(spark, sqlqueue_options("default"), ROUTED).count() == 0
    assert load_messages(spark, sqlqueue_options(), [ROUTED], engine="python").count() == 40
    with pytest.raises(Exception, match="topics live in different databases"):
        reader(spark, sqlqueue_options(), f"{PLAIN},{ROUTED}").collect()


def test_a_bulk_write_goes_to_the_topics_database_or_to_using(spark) -> None:
    df = spark.createDataFrame(
        [(f"w{i}", f"k{i % 4}", json.dumps({"n": i})) for i in range(30)], "id string, key string, payload string"
    )
    df.write.format("sqlqueue").options(**sqlqueue_options()).option("topic", ROUTED).mode("append").save()
    assert Message.objects.using("second").filter(topic=ROUTED).count() == 30
    assert not Message.objects.using("default").filter(topic=ROUTED).exists()
    # A topic without a route, written where option "using" says.
    df.write.format("sqlqueue").options(**sqlqueue_options()).option("using", "second").option("topic", PLAIN).mode(
        "append"
    ).save()
    assert Message.objects.using("second").filter(topic=PLAIN).count() == 30
    assert not Message.objects.using("default").filter(topic=PLAIN).exists()
    # Written again: idempotent in its database.
    df.write.format("sqlqueue").options(**sqlqueue_options()).option("topic", ROUTED).mode("append").save()
    assert Message.objects.using("second").filter(topic=ROUTED).count() == 30
    with pytest.raises(Exception, match="database alias 'nope' is not one the options hold"):
        df.write.format("sqlqueue").options(**sqlqueue_options()).option("using", "nope").option("topic", ROUTED).mode(
            "append"
        ).save()


def test_a_stream_of_a_routed_topic_reads_and_commits_its_group_in_that_database(spark, tmp_path) -> None:
    publish_to(ROUTED, 25, "s")
    df = stream(spark, sqlqueue_options(), ROUTED, group="lake")
    progress = run_to_parquet(df, tmp_path / "out", tmp_path / "checkpoint")
    assert sum(p["numInputRows"] for p in progress) == 25
    assert spark.read.parquet(str(tmp_path / "out")).count() == 25
    # The group's watermarks are in the topic's database, at its heads; none in the default one.
    heads = QueueStore("second").heads([ROUTED])
    marks = {(w.topic, w.partition): w.offset for w in QueueStore("second").watermarks("lake")}
    assert marks == heads and sum(heads.values()) == 25
    assert QueueStore("default").watermarks("lake") == []


def test_replay_to_group_starts_the_group_in_the_topics_database() -> None:
    publish_to(ROUTED, 6, "g")
    marks = replay_to_group(ROUTED, "audit", timezone.now() - dt.timedelta(hours=1))
    assert marks and set(marks.values()) == {0}
    assert {w.group for w in QueueStore("second").watermarks(topic=ROUTED)} == {"audit"}
    assert QueueStore("default").watermarks("audit") == []
