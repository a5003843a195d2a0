"""``manage.py queue_prune_task_results``: delete finished task results past their retention."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_sqlqueue.tasks.discovery import configured_aliases

from . import _args
from ._console import ops_errors


class Command(BaseCommand):
    help = (
        "Delete results of finished tasks (SUCCESSFUL or FAILED) older than each backend's "
        "OPTIONS['RESULT_RETENTION'] (default 7 days), or --older-than seconds. Tasks not finished are kept."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--older-than", type=_args.seconds, default=None, help="seconds since the task finished")
        parser.add_argument("--backend", type=_args.text(), default=None, help="only this TASKS alias")
        parser.add_argument("--dry-run", action="store_true", help="count, delete nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        aliases = configured_aliases()
        if options["backend"] is not None:
            if options["backend"] not in aliases:
                raise CommandError(
                    f"TASKS has no SQLQueueBackend alias {options['backend']!r} "
                    f"(configured: {', '.join(aliases) or 'none'})."
                )
            aliases = [options["backend"]]
        if not aliases:
            raise CommandError("settings.TASKS configures no django_sqlqueue.tasks.SQLQueueBackend.")
        # Again for call_command(older_than=...), which skips the parser: nan and inf included.
        older_than = _args.checked(options["older_than"], "--older-than", _args.seconds)
        from django_sqlqueue.tasks.compat import task_backends
        from django_sqlqueue.tasks.results import prune

        for alias in aliases:
            backend: Any = task_backends[alias]
            older = older_than if older_than is not None else backend.sqlqueue.result_retention
            with ops_errors():
                n = prune(older_than=older, backend=alias, dry_run=options["dry_run"])
            verb = "would delete" if options["dry_run"] else "deleted"
            self.stdout.write(f"{alias}: {verb} {n} finished task result(s) older than {older:g}s")
        from django_sqlqueue.tasks.uniqueness import prune_claims

        with ops_errors():
            n = prune_claims(dry_run=options["dry_run"])
        if n:  # (tasks/uniqueness.py: claims of @unique tasks)
            self.stdout.write(f"{verb} {n} unique task claim(s) that no longer count (expired, or task finished)")
