"""management/commands/queue_status.py: the atomic consumers it lists, in the table and in JSON.

The table, its filters and JSON: tests/management/test_commands.py.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
from django.core.management import call_command

from django_sqlqueue.consumers import ConsumerSpec, registry
from django_sqlqueue.management.commands import queue_status

pytestmark = pytest.mark.django_db


def status(*args: str) -> str:
    out = io.StringIO()
    call_command(queue_status.Command(), *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def atomic_consumers() -> Iterator[None]:
    specs = [
        ConsumerSpec(topic="status.orders", group="ledger", handler=lambda m: None, atomic=True),
        ConsumerSpec(topic="status.orders", group="stock", handler=lambda m: None, atomic="batch"),
    ]
    for spec in specs:
        registry.register(spec)
    yield
    for spec in specs:
        registry.unregister(spec.group, spec.topic)


@pytest.mark.usefixtures("atomic_consumers")
def test_atomic_consumers_are_listed_with_their_mode() -> None:
    lines = status("--topic", "status.orders").splitlines()
    at = lines.index("atomic consumers declared in this project (handler writes and ack commit together):")
    assert lines[at + 1 :] == [
        "group   topic          atomic",
        "ledger  status.orders  per message",
        "stock   status.orders  per batch",
    ]
    listed = json.loads(status("--json", "--topic", "status.orders"))["atomic_consumers"]
    assert listed == [
        {"group": "ledger", "topic": "status.orders", "atomic": "per message"},
        {"group": "stock", "topic": "status.orders", "atomic": "per batch"},
    ]


@pytest.mark.django_db(databases=["default", "second"])
def test_every_database_gets_its_own_section_and_json_object() -> None:
    from django.test import override_settings
    from django.utils import timezone

    from django_sqlqueue import publish
    from django_sqlqueue.models import ConsumerOffset, Message

    from ..support.engine_helpers import sequence

    with override_settings(SQLQUEUE={"TOPIC_DATABASES": {"second.*": "second"}}):  # and nothing else
        publish("first.orders", {"i": 0}, key="k")
        publish("second.orders", {"i": 0}, key="k")
        for topic in ("first.orders", "second.orders"):
            sequence(topic)
            alias = "second" if topic.startswith("second.") else "default"
            (partition,) = Message.objects.using(alias).filter(topic=topic).values_list("partition", flat=True)
            ConsumerOffset.objects.using(alias).create(
                consumer_group="ledger", topic=topic, partition=partition, offset_acked=0, updated_at=timezone.now()
            )
        text = status()
        default_part, second_part = text.split("database second:")
        assert default_part.startswith("database default:")
        assert "first.orders" in default_part and "second.orders" not in default_part
        assert "second.orders" in second_part and "first.orders" not in second_part
        both = json.loads(status("--json"))
        assert [(d["database"], [g["group"] for g in d["groups"]]) for d in both] == [
            ("default", ["ledger"]),
            ("second", ["ledger"]),
        ]
        one = json.loads(status("--json", "--topic", "second.orders"))
        assert one["database"] == "second" and [p["topic"] for p in one["partitions"]] == ["second.orders"]
        assert "database" not in status("--database", "default")
