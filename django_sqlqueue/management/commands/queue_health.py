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
            health = ops.check_health(thresholds, group=options["group"], topic=options["topic"])
        except SQLQueueError as exc:
            raise CommandError(str(exc), returncode=UNKNOWN) from exc
        except DatabaseError as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise CommandError(
                f"could not read the queue database: {type(exc).__name__}: {first}", returncode=UNKNOWN
            ) from exc
        for problem in health.problems:
            self.stdout.write(problem.line)
        if not health.healthy:
            sys.exit(UNHEALTHY)
        self.stdout.write(f"ok: {len(health.groups)} group/topic pair(s) checked")
