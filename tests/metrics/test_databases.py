"""The gauges of every database of the queue, each series labelled ``database``; a database that
cannot be read is reported (``sqlqueue_database_up`` 0) without failing the others.

The ``second_routes`` fixture routes ``second.*`` to the alias ``second``, a database of its own. The
unreachable database is a real connection attempt: an alias on the suite's server at a port
nothing listens on (on SQLite, a file in a directory that does not exist).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.db import connections
from django.db.utils import load_backend
from django.test import override_settings

from django_sqlqueue import ops, publish_many
from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.metrics import views
from django_sqlqueue.metrics.gauges import read_snapshots
from django_sqlqueue.metrics.worker import WorkerMetrics

from ..support.ports import free_port
from .test_metrics import TOKEN, URL, samples, value

pytestmark = [
    pytest.mark.django_db(databases=["default", "second"], transaction=True),
    pytest.mark.usefixtures("second_routes"),  # second.* in the alias "second" (tests/conftest.py)
]


@pytest.fixture
def scene(second_routes: None) -> Iterator[None]:
    """A sequenced topic with unsequenced messages (3 and 2) and a paused group in each database."""
    views.clear_cache()
    for topic, alias, waiting in (("first.events", "default", 3), ("second.events", "second", 2)):
        # One key: one partition, which the sequencer has numbered (the gauge counts per head row).
        publish_many(topic, [{"payload": "numbered", "key": "k"}])
        sequence(topic, using=alias)
        publish_many(topic, [{"payload": {"n": i}, "key": "k"} for i in range(waiting)])
    ops.pause("g1", "first.events", using="default")
    ops.pause("g2", "second.events", using="second")
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_TOKEN": TOKEN}):
        yield
    views.clear_cache()


@pytest.fixture
def unreachable(scene: None) -> Iterator[str]:
    """An alias ``down`` whose database cannot be reached, with the topics ``down.*`` routed to it.

    Its connection is made here, outside ``connections.settings`` (Django lets a test use
    such a dynamically created connection); ``settings.DATABASES`` names it for the routes' check.
    """
    default = connections["default"].settings_dict
    if default["ENGINE"].endswith("sqlite3"):
        entry = {"ENGINE": default["ENGINE"], "NAME": "/nonexistent-sqlqueue-dir/down.sqlite3"}
    else:
        entry = {**default, "HOST": "127.0.0.1", "PORT": str(free_port()), "NAME": "down", "TEST": {}}
    entry = connections.configure_settings({"default": entry})["default"]
    connections["down"] = load_backend(entry["ENGINE"]).DatabaseWrapper(entry, "down")
    routes = {**settings.SQLQUEUE["TOPIC_DATABASES"], "down.*": "down"}
    queue = {**settings.SQLQUEUE, "METRICS_TOKEN": TOKEN, "TOPIC_DATABASES": routes}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding setting DATABASES can lead to unexpected behavior"
            with override_settings(DATABASES={**settings.DATABASES, "down": entry}, SQLQUEUE=queue):
                yield "down"
    finally:
        views.clear_cache()
        connections["down"].close()
        del connections["down"]


def test_every_series_names_its_database_and_every_database_is_scraped(client, scene) -> None:
    found = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    assert value(found, "sqlqueue_database_up", database="default") == 1
    assert value(found, "sqlqueue_database_up", database="second") == 1
    unsequenced = "sqlqueue_topic_unsequenced_messages"
    assert value(found, unsequenced, database="default", topic="first.events") == 3
    assert value(found, unsequenced, database="second", topic="second.events") == 2
    assert value(found, "sqlqueue_consumergroup_paused", database="default", group="g1", topic="first.events") == 1
    assert value(found, "sqlqueue_consumergroup_paused", database="second", group="g2", topic="second.events") == 1
    # Nothing of one database is reported under the other.
    assert not [key for key in found if ("topic", "second.events") in key[1] and ("database", "second") not in key[1]]
    assert all(dict(labels).get("database") in ("default", "second") for _, labels in found)


def test_an_unreachable_database_is_reported_and_the_others_are_still_served(client, scene, unreachable) -> None:
    snapshot = read_snapshots()
    assert [s.database for s in snapshot.snapshots] == ["default", "second"]
    assert snapshot.down == [unreachable]
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    found = samples(response.content.decode())
    assert value(found, "sqlqueue_database_up", database="down") == 0
    assert value(found, "sqlqueue_database_up", database="default") == 1
    assert value(found, "sqlqueue_database_up", database="second") == 1
    assert value(found, "sqlqueue_topic_unsequenced_messages", database="second", topic="second.events") == 2
    assert value(found, "sqlqueue_consumergroup_paused", database="default", group="g1", topic="first.events") == 1
    # The next scrape (after the cache window) tries the database again, and the others still answer.
    views.clear_cache()
    again = samples(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode())
    assert value(again, "sqlqueue_database_up", database="down") == 0
    assert value(again, "sqlqueue_database_up", database="second") == 1


def test_a_workers_metrics_name_the_database_of_each_topic() -> None:
    metrics = WorkerMetrics()
    metrics.polled("g1", "first.events", 0.01, 1)
    metrics.polled("g2", "second.events", 0.01, 0)
    metrics.sequenced("second.events", 0.01, 4)
    metrics.leases("g2", "second.events.dlq", acquired=1)  # a dead-letter topic lives with its topic
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert got[("sqlqueue_polls_total", (("database", "default"), ("group", "g1"), ("topic", "first.events")))] == 1
    assert got[("sqlqueue_polls_empty_total", (("database", "second"), ("group", "g2"), ("topic", "second.events")))]
    assert got[("sqlqueue_sequenced_messages_total", (("database", "second"), ("topic", "second.events")))] == 4
    leased = (
        "sqlqueue_leases_acquired_total",
        (("database", "second"), ("group", "g2"), ("topic", "second.events.dlq")),
    )
    assert got[leased] == 1
