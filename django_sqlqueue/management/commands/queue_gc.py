"""``manage.py queue_gc``: delete messages every consumer group has acked."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from django_sqlqueue.ops.gc import collect_garbage

from . import _args
from ._console import ops_errors


class Command(BaseCommand):
    help = "Delete messages at or below every consuming group's watermark (and past SQLQUEUE['RETENTION'])."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--topic", action="append", type=_args.topic, default=None, help="only this topic (repeatable)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        with ops_errors():
            deleted = collect_garbage(topics=options["topic"])
        for topic, count in deleted.items():
            if count or options["verbosity"] > 1:
                self.stdout.write(f"{topic}: deleted {count} message(s)")
        self.stdout.write(f"deleted {sum(deleted.values())} message(s) in {len(deleted)} topic(s)")
