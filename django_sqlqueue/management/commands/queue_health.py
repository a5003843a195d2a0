"""``manage.py queue_health``: one line per threshold crossed; exit 0 healthy, 1 unhealthy, 2 could not check.

For Kubernetes exec probes, cron and monitoring plugins. The checks are ``ops.check_health``
(``ops/health.py``); this command parses the thresholds and prints. A threshold not given
on the command line is taken from ``SQLQUEUE["HEALTH"]`` (the console's overview checks those).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DatabaseError

from django_sqlqueue import ops
from django_sqlqueue.exceptions import SQLQueueError
from django_sqlqueue.rules.limits import MAX_BIGINT, MAX_SECONDS

from . import _args
from ._console import add_database_option, chosen_databases

#: Exit statuses: healthy, a threshold crossed, could not check (bad usage, unknown group
#: or topic, database unreachable or any other database error).
HEALTHY, UNHEALTHY, UNKNOWN = 0, 1, 2


class Command(BaseCommand):
    help = (
        "Check the consumer groups against thresholds (each off unless given here or in SQLQUEUE['HEALTH']): "
        "print one line per problem "
        "('<check> group=<g> topic=<t> value=<v> max=<n>'), exit 0 when healthy, 1 when a threshold is crossed, "
        "2 when the check could not run (bad usage, unknown group/topic, database unreachable)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--group", type=_args.group, help="only this consumer group")
        parser.add_argument("--topic", type=_args.topic, help="only this topic")
        # The thresholds' own rules (>= 0, finite) are ops.Thresholds', shared with the console and
        # answered with exit status 2 under call_command too; handle() adds the upper bounds.
        parser.add_argument("--max-lag", type=int, help="most messages a group may lag behind on a topic")
        parser.add_argument(
            "--max-lag-seconds",
            type=float,
            help="oldest age in seconds of a message a group has not handled yet (database clock)",
        )
        parser.add_argument("--max-dead-letters", type=int, help="most dead letters a group may have on a topic")
        parser.add_argument(
            "--require-subscribers",
            action="store_true",
            default=None,
            help="every group needs at least one live subscriber on each topic it consumes",
        )
        add_database_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        for name, most in (("max_lag", MAX_BIGINT), ("max_dead_letters", MAX_BIGINT), ("max_lag_seconds", MAX_SECONDS)):
            # A count above BIGINT cannot be compared in SQL (SQLite's driver cannot even send it).
            if options[name] is not None and options[name] > most:
                flag = "--" + name.replace("_", "-")
                raise CommandError(f"{flag} must be at most {most}, got {options[name]}.", returncode=UNKNOWN)
        try:
            given = {
                name: options[name]
                for name in ("max_lag", "max_lag_seconds", "max_dead_letters", "require_subscribers")
                if options[name] is not None
            }
            # Each flag overrides its SQLQUEUE["HEALTH"] value; the rest come from the setting.
            thresholds = dataclasses.replace(ops.configured_thresholds(), **given)
            aliases = chosen_databases(options["database"], options["topic"])
            problems: list[str] = []
            missing: list[ops.NotFound] = []
            checked = 0
            for alias in aliases:
                try:
                    health = ops.check_health(thresholds, group=options["group"], topic=options["topic"], using=alias)
                except ops.NotFound as exc:
                    missing.append(exc)  # the group may live in another database only
                    continue
                # Several databases: each line names its own.
                prefix = f"database={alias} " if len(aliases) > 1 else ""
                problems += [prefix + problem.line for problem in health.problems]
                checked += len(health.groups)
            if len(missing) == len(aliases):
                raise missing[0]
        except SQLQueueError as exc:
            raise CommandError(str(exc), returncode=UNKNOWN) from exc
        except DatabaseError as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise CommandError(
                f"could not read the queue database: {type(exc).__name__}: {first}", returncode=UNKNOWN
            ) from exc
        for line in problems:
            self.stdout.write(line)
        if problems:
            sys.exit(UNHEALTHY)
        where = f" in {len(aliases)} databases" if len(aliases) > 1 else ""
        self.stdout.write(f"ok: {checked} group/topic pair(s) checked{where}")
