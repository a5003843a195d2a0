"""spark/frames.py: choosing the engine that loads messages, and loading them by time."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from django_sqlqueue.models import Message
from django_sqlqueue.spark.frames import choose_engine, load_messages
from django_sqlqueue.spark.options import SparkOptionError

from .helpers import publish_sequenced

pytestmark = pytest.mark.django_db(transaction=True)


class Conf:
    def __init__(self, jars: str) -> None:
        self.jars = jars

    def get(self, name: str, default: str = "") -> str:
        return self.jars if name == "spark.jars" else default


class Session:
    """What choose_engine reads of a SparkSession: its ``spark.jars``."""

    def __init__(self, jars: str = "") -> None:
        self.conf = Conf(jars)


MYSQL = {"engine": "django.db.backends.mysql"}
JAR = "/usr/share/java/mariadb-java-client.jar"


def test_auto_is_jdbc_only_on_mysql_with_the_driver_and_jdbc_is_refused_elsewhere() -> None:
    assert choose_engine(Session(JAR), MYSQL, "auto") == "jdbc"
    assert choose_engine(Session(), MYSQL, "auto") == "python"
    assert choose_engine(Session(JAR), {"engine": "django.db.backends.postgresql"}, "auto") == "python"
    assert choose_engine(Session(), MYSQL, "python") == "python"
    with pytest.raises(SparkOptionError, match="needs the MariaDB JDBC driver"):
        choose_engine(Session(), MYSQL, "jdbc")
    with pytest.raises(SparkOptionError, match="reads MySQL/MariaDB only"):
        choose_engine(Session(JAR), {"engine": "django.db.backends.sqlite3"}, "jdbc")
    with pytest.raises(SparkOptionError, match="engine must be one of auto, python, jdbc"):
        choose_engine(Session(), MYSQL, "odbc")


def test_load_messages_reads_the_topics_published_in_the_window(spark, queue_options) -> None:
    publish_sequenced("frames.a", 4, prefix="a")
    publish_sequenced("frames.b", 2, prefix="b")
    Message.objects.filter(topic="frames.a", id__in=["a0", "a1"]).update(
        published_at=timezone.now() - dt.timedelta(hours=2)
    )
    everything = load_messages(spark, queue_options, ["frames.a", "frames.b"], engine="python")
    assert sorted(r["id"] for r in everything.collect()) == ["a0", "a1", "a2", "a3", "b0", "b1"]
    recent = load_messages(
        spark, queue_options, ["frames.a"], engine="python", start_time=timezone.now() - dt.timedelta(hours=1)
    )
    assert sorted(r["id"] for r in recent.collect()) == ["a2", "a3"]
    with pytest.raises(SparkOptionError, match="no topic given"):
        load_messages(spark, queue_options, [])
