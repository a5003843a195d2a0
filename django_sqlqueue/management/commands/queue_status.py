"""``manage.py queue_status``: head, watermark, lag, deliveries, DLQ and lease per partition."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand

from django_sqlqueue.ops import list_topics
from django_sqlqueue.ops.status import ConsumerInfo, QueueStatus, queue_status

from . import _args
from ._console import add_database_option, chosen_databases, ops_errors, table

COLUMNS = (
    "group",
    "topic",
    "partition",
    "head",
    "watermark",
    "unsequenced",
    "lag",
    "in flight",
    "retrying",
    "leased by",
)


class Command(BaseCommand):
    help = (
        "Show per group/topic/partition head offset, watermark, messages waiting for the sequencer, lag, "
        "in-flight, retrying, lease; per group the dead letters."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--group", type=_args.group, help="only this consumer group")
        parser.add_argument("--topic", type=_args.topic, help="only this topic")
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        add_database_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        aliases = chosen_databases(options["database"], options["topic"])
        with ops_errors():
            statuses = {
                alias: queue_status(group=options["group"], topic=options["topic"], using=alias) for alias in aliases
            }
        if options["json"]:
            # One object per database, each naming it; a single database prints its object alone.
            out = [{"database": alias, **asdict(status)} for alias, status in statuses.items()]
            self.stdout.write(json.dumps(out[0] if len(out) == 1 else out, indent=2, default=str))
            return
        for i, (alias, status) in enumerate(statuses.items()):
            if len(statuses) > 1:
                self.stdout.write(("" if i == 0 else "\n") + f"database {alias}:")
            self._report(status, alias)
        # The atomic consumers are this project's declarations, the same whatever the database.
        self._atomic(next(iter(statuses.values())).atomic_consumers)

    def _report(self, status: QueueStatus, alias: str) -> None:
        if not status.groups:
            self.stdout.write("no consumer group has consumed anything yet")
            self._unconsumed_topics(alias)
            return
        rows = [
            (
                p.group,
                p.topic,
                p.partition,
                p.head,
                p.watermark,
                p.unsequenced,
                p.lag,
                p.in_flight,
                p.retrying,
                (p.lease_holder or "-") + ("" if p.lease_live or not p.lease_holder else " (expired)"),
            )
            for p in status.partitions
        ]
        for line in table(COLUMNS, rows):
            self.stdout.write(line)
        self.stdout.write("")
        for g in status.groups:
            self.stdout.write(
                f"group {g.group}: {len(g.topics)} topic(s), {g.partitions} partition(s), lag {g.lag}, "
                f"waiting for the sequencer {g.unsequenced}, in flight {g.in_flight}, retrying {g.retrying}, "
                f"dead letters {g.dead_letters}, "
                f"live subscribers {g.live_subscribers}"
            )
        self._unconsumed_topics(alias)

    def _atomic(self, consumers: list[ConsumerInfo]) -> None:
        """Print the atomic consumers this project declares (handler writes and ack in one transaction)."""
        if not consumers:
            return
        self.stdout.write("")
        self.stdout.write("atomic consumers declared in this project (handler writes and ack commit together):")
        for line in table(("group", "topic", "atomic"), [(c.group, c.topic, c.atomic) for c in consumers]):
            self.stdout.write(line)

    def _unconsumed_topics(self, alias: str) -> None:
        """Print the topics no group consumes: an orphaned topic's messages are never collected
        (a typo, a retired consumer); a dead-letter topic's wait for a replay or a purge."""
        topics = list_topics(using=alias)
        orphaned = [t.topic for t in topics if t.orphaned]
        dead_letters = [t.topic for t in topics if t.unconsumed and t.dead_letter_topic]
        if orphaned:
            self.stdout.write(f"topics nobody consumes (never collected): {', '.join(orphaned)}")
        if dead_letters:
            self.stdout.write(f"dead-letter topics (kept until replayed or purged): {', '.join(dead_letters)}")
