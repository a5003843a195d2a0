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
