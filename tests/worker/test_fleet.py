"""worker/fleet.py: one worker per database in one process (issue 32).

In-process, on the real databases ``default`` and ``second`` (tests/support/settings.py routes
``second.*`` there). The runconsumer processes serving both, killed with ``kill -9``, are in
tests/processes/test_databases.py.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_sqlqueue import publish_many
from django_sqlqueue.consumers import ConsumerSpec
from django_sqlqueue.exceptions import QueueTablesMissing
from django_sqlqueue.models import ConsumerOffset, PartitionLease, SubscriberHeartbeat
from django_sqlqueue.schedules import parse_schedule
from django_sqlqueue.worker.fleet import Fleet, SharedHealth, plan, require_tables

from ..support.engine_helpers import Calls, fast_conf, wait_until
from ..test_publisher import fresh_alias  # noqa: F401 - a fixture: a database without the queue's tables

ROUTES = {"second.*": "second"}
ROUTED, PLAIN = "second.fleet", "first.fleet"


def conf(**overrides: Any) -> Any:
    return fast_conf(TOPIC_DATABASES=ROUTES, **overrides)


def specs(handler: Any) -> list[ConsumerSpec]:
    return [ConsumerSpec(topic=topic, group="g", handler=handler) for topic in (PLAIN, ROUTED, "second.other")]


def test_plan_groups_consumers_by_their_topics_database() -> None:
    planned = plan(specs(print), conf())
    assert {alias: [s.topic for s in found] for alias, found in planned.items()} == {
        "default": [PLAIN],
        "second": [ROUTED, "second.other"],
    }
    assert list(plan(specs(print), conf(), ["second"])) == ["second"]
    only_default = [s for s in specs(print) if s.topic == PLAIN]
    assert list(plan(only_default, conf())) == ["default"]  # a database without consumers: no worker
    assert plan(only_default, conf(), ["second"]) == {}


def test_the_shared_health_file_is_touched_only_while_every_worker_is_healthy(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    shared = SharedHealth(str(path), 2)
    first, second = shared.member(0), shared.member(1)
    first.beat(True)
    assert not path.exists()  # the second worker has not finished a healthy round yet
    second.beat(True)
    assert path.exists()
    os.utime(path, (0, 0))
    second.beat(False)  # an outage of the second database
    first.beat(True)
    assert path.stat().st_mtime == 0
    shared.file._last = None  # (its own once-a-second limit aside)
    second.beat(True)
    assert path.stat().st_mtime > 0


@contextmanager
def fleet_running(fleet: Fleet) -> Iterator[list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fleet.run()
        except BaseException as exc:  # noqa: BLE001 - checked by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name="fleet", daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        fleet.stop()
        thread.join(20)
        assert not thread.is_alive(), "the fleet did not stop within 20s"


@pytest.mark.django_db(databases=["default", "second"], transaction=True)
@pytest.mark.usefixtures("second_routes")
def test_a_fleet_serves_each_database_with_its_own_worker(tmp_path: Path) -> None:
    calls = Calls()
    planned = plan(specs(lambda m: calls.add((m.topic, m.payload))), conf())
    every_second = {"cron": "* * * * * *", "topic": "first.tick", "payload": {}}
    fleet = Fleet.build(
        planned,
        name="w1",
        conf=conf(),
        schedules=[parse_schedule("tick", every_second)],
        health_file=str(tmp_path / "alive"),
    )
    assert fleet.aliases == ["default", "second"]
    # Schedules fire from the worker of SQLQUEUE["DATABASE"] only (their state rows live there).
    assert [w.scheduler is not None for w in fleet.workers] == [True, False]
    publish_many(PLAIN, [{"payload": n, "key": "k"} for n in range(5)])
    publish_many(ROUTED, [{"payload": n, "key": "k"} for n in range(5)])
    with fleet_running(fleet) as errors:
        wait_until(lambda: len(calls) == 10, what="both databases' messages handled")
        wait_until(lambda: (tmp_path / "alive").exists(), what="the health file of two healthy workers")
        # Leases, heartbeats and watermarks live in each topic's database.
        for alias, topic in (("default", PLAIN), ("second", ROUTED)):
            assert PartitionLease.objects.using(alias).filter(topic=topic, leased_by="w1").count() == 8
            assert SubscriberHeartbeat.objects.using(alias).filter(subscriber_name="w1").exists()
        assert not PartitionLease.objects.using("second").filter(topic=PLAIN).exists()
    assert errors == []
    assert [p for t, p in calls.list() if t == ROUTED] == [0, 1, 2, 3, 4]  # one key: in order
    assert sum(ConsumerOffset.objects.using("second").filter(topic=ROUTED).values_list("offset_acked", flat=True)) == 5
    # Stopped: each worker handed back its leases in its own database.
    assert not PartitionLease.objects.using("second").filter(leased_by="w1").exists()
    assert not PartitionLease.objects.using("default").filter(leased_by="w1").exists()


@pytest.mark.django_db(databases=["default", "second"], transaction=True)
@pytest.mark.usefixtures("second_routes")
def test_a_worker_that_ends_stops_the_others_and_its_error_is_raised() -> None:
    """A handler of the second database raises SystemExit: its worker hands back and ends; the
    default database's worker is stopped too, and the fleet raises the SystemExit."""

    def handle(message: Any) -> None:
        if message.topic == ROUTED:
            raise SystemExit(3)

    fleet = Fleet.build(plan(specs(handle), conf()), name="w2", conf=conf())
    publish_many(ROUTED, [{"payload": 1}])
    with fleet_running(fleet) as errors:
        wait_until(lambda: errors, timeout=20, what="the fleet to stop")
    assert [type(e) for e in errors] == [SystemExit] and errors[0].code == 3
    assert all(w.stop_event.is_set() for w in fleet.workers)
    assert not PartitionLease.objects.using("default").filter(leased_by="w2").exists()


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_require_tables_names_the_migrate_command(fresh_alias: str) -> None:  # noqa: F811
    """runconsumer checks this before its workers start (a routed alias never migrated)."""
    require_tables(["default"])  # migrated
    with pytest.raises(
        QueueTablesMissing, match=r"database 'fresh'.*`manage\.py migrate django_sqlqueue --database fresh`"
    ):
        require_tables(["default", fresh_alias])
