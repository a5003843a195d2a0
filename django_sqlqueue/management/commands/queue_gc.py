"""``manage.py queue_gc``: delete messages every consumer group has acked."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_sqlqueue.conf import get_settings
from django_sqlqueue.ops.gc import MAX_PACE, collect_garbage

from . import _args
from ._console import add_database_option, chosen_databases, ops_errors


class Command(BaseCommand):
    help = "Delete messages at or below every consuming group's watermark (and past SQLQUEUE['RETENTION'])."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--topic",
            action="append",
            type=_args.topic,
            default=None,
            help="only this topic (repeatable), in its own database",
        )
        parser.add_argument(
            "--pace",
            type=_args.bounded_float(0, MAX_PACE),
            default=0.0,
            help="after each delete statement, sleep PACE times as long as it took (default 0: full speed; "
            "1: half the database time; 3: a quarter), for a big clean-up next to busy publishers",
        )
        add_database_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        conf = get_settings()
        aliases = chosen_databases(options["database"])
        topics = options["topic"]
        total: dict[str, int] = {}
        with ops_errors():
            for alias in aliases:
                # --topic: each topic in its own database (unless --database names another).
                mine = (
                    None
                    if topics is None
                    else [t for t in topics if options["database"] or conf.database_for(t) == alias]
                )
                if mine == []:
                    continue
                deleted = collect_garbage(topics=mine, using=alias, pace=options["pace"])
                # Several databases: each line names its database.
                prefix = f"database={alias} " if len(aliases) > 1 else ""
                for topic, count in deleted.items():
                    if count or options["verbosity"] > 1:
                        self.stdout.write(f"{prefix}{topic}: deleted {count} message(s)")
                    total[topic] = total.get(topic, 0) + count
        where = f" in {len(aliases)} databases" if len(aliases) > 1 else ""
        self.stdout.write(f"deleted {sum(total.values())} message(s) in {len(total)} topic(s){where}")
