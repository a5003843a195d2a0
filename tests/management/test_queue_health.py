"""management/commands/queue_health.py: its three exit statuses, as the module names them.

Every threshold, the setting's defaults and real processes: tests/ops/test_health.py.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_sqlqueue import publish
from django_sqlqueue.management.commands import queue_health
from django_sqlqueue.management.commands.queue_health import HEALTHY, UNHEALTHY, UNKNOWN
from django_sqlqueue.models import ConsumerOffset, Message

from ..support.console_scene import SETTINGS, build
from ..support.engine_helpers import sequence

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("scene_settings")]


def health(*args: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    try:
        call_command(queue_health.Command(), *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue().splitlines()
    return HEALTHY, out.getvalue().splitlines()


def test_healthy_unhealthy_and_could_not_check_are_0_1_and_2() -> None:
    build()
    assert (HEALTHY, UNHEALTHY, UNKNOWN) == (0, 1, 2)
    assert health("--group", "shipping", "--max-lag", "0") == (HEALTHY, ["ok: 1 group/topic pair(s) checked"])
    assert health("--group", "billing", "--max-lag", "3") == (
        UNHEALTHY,
        ["lag group=billing topic=orders value=4 max=3"],
    )
    with pytest.raises(CommandError, match="nobody") as failure:
        health("--group", "nobody")
    assert failure.value.returncode == UNKNOWN


@pytest.mark.django_db(databases=["default", "second"])
def test_every_database_is_checked_and_each_line_names_its_own() -> None:
    # The console scene's settings, with the second database's topics routed to it.
    with override_settings(SQLQUEUE={**SETTINGS, "TOPIC_DATABASES": {"second.*": "second"}}):
        two_databases()


def two_databases() -> None:
    build()
    for i in range(3):
        publish("second.orders", {"i": i}, key="k")
    sequence("second.orders")
    partition = Message.objects.using("second").values_list("partition", flat=True).first()
    ConsumerOffset.objects.using("second").create(
        consumer_group="ledger", topic="second.orders", partition=partition, offset_acked=0, updated_at=timezone.now()
    )
    code, lines = health("--max-lag", "3")
    assert code == UNHEALTHY
    assert "database=second lag group=ledger topic=second.orders value=3 max=3" not in lines  # 3 is not over 3
    code, lines = health("--max-lag", "2")
    assert code == UNHEALTHY
    assert "database=second lag group=ledger topic=second.orders value=3 max=2" in lines
    assert "database=default lag group=billing topic=orders value=4 max=2" in lines
    # One database, or a topic's own: no prefix, the other database not read.
    assert health("--database", "second", "--max-lag", "2") == (
        UNHEALTHY,
        ["lag group=ledger topic=second.orders value=3 max=2"],
    )
    assert health("--topic", "second.orders", "--max-lag", "3") == (HEALTHY, ["ok: 1 group/topic pair(s) checked"])
    # A group only one database has is found there; one no database has is an error.
    assert health("--group", "ledger", "--max-lag", "5") == (
        HEALTHY,
        ["ok: 1 group/topic pair(s) checked in 2 databases"],
    )
    with pytest.raises(CommandError, match="nobody"):
        health("--group", "nobody")
    with pytest.raises(CommandError, match="--database elsewhere: not a database of the queue"):
        health("--database", "elsewhere")
