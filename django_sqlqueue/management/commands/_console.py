"""Shared plumbing of the ``queue_dlq``, ``queue_group`` and ``queue_topic`` commands.

A command is a set of subcommands (``SUBCOMMANDS``: name -> (help, add_arguments,
handler)); each handler calls :mod:`django_sqlqueue.ops` and prints a result. Adding a
subcommand is one entry, its logic stays in the service layer.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from typing import Any, ClassVar

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_sqlqueue.exceptions import SQLQueueError
from django_sqlqueue.rules.timeparse import parse_time as parse_iso_time

Handler = Callable[["SubcommandCommand", dict[str, Any]], None]
Subcommand = tuple[str, Callable[[CommandParser], None], Handler]


def to_jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        out = asdict(value)
        for name in ("lag", "redeliver", "skip", "exact", "total", "unconsumed"):
            if hasattr(type(value), name) and isinstance(getattr(type(value), name), property):
                out[name] = getattr(value, name)
        return to_jsonable(out)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


def table(head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
    """Return the lines of a text table with aligned columns (None shows as "-")."""
    cells = [tuple(str(c) for c in head)] + [tuple("-" if c is None else str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def parse_time(value: str | dt.datetime | None) -> dt.datetime | None:
    """Parse an ISO 8601 time option (naive = UTC); raise CommandError when it is not one.

    The parser's ``_args.time`` type has parsed it already when it came from the command line.
    """
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)
    try:
        return parse_iso_time(value)
    except ValueError:
        raise CommandError(f"{value!r} is not an ISO 8601 date and time (e.g. 2026-01-31T12:00:00Z).") from None


@contextmanager
def ops_errors() -> Iterator[None]:
    """Turn an error of the service layer (``OperationError``, any ``SQLQueueError``) into the
    command's one-line ``CommandError``: the operator sees what was refused, not a traceback."""
    try:
        yield
    except SQLQueueError as exc:
        raise CommandError(str(exc)) from exc


class SubcommandCommand(BaseCommand):
    SUBCOMMANDS: ClassVar[dict[str, Subcommand]] = {}

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{" + ",".join(self.SUBCOMMANDS) + "}")
        for name, (help_text, add, _) in self.SUBCOMMANDS.items():
            p = sub.add_parser(name, help=help_text)
            p.add_argument("--json", action="store_true", help="print JSON")
            add(p)

    def handle(self, *args: Any, **options: Any) -> None:
        _, _, handler = self.SUBCOMMANDS[options["subcommand"]]
        with ops_errors():
            handler(self, options)

    # -- helpers for handlers -------------------------------------------------------------

    def emit(self, options: dict[str, Any], data: Any, text: str | list[str]) -> None:
        if options.get("json"):
            self.stdout.write(json.dumps(to_jsonable(data), indent=2, default=str))
        else:
            for line in [text] if isinstance(text, str) else text:
                self.stdout.write(line)

    def table(self, head: tuple[str, ...], rows: list[tuple[Any, ...]]) -> list[str]:
        return table(head, rows)

    def confirm(self, options: dict[str, Any], question: str) -> None:
        confirm(options, question)


def confirm(options: dict[str, Any], question: str) -> None:
    """Ask before a destructive action unless --yes/--noinput; refuse without a terminal."""
    if options.get("yes") or not options.get("interactive", True):
        return
    if not sys.stdin or not sys.stdin.isatty():
        raise CommandError(f"{question} -- refusing without confirmation: pass --yes (or --noinput).")
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:  # the terminal closed (Ctrl-D)
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CommandError("aborted, nothing was changed.")


def destructive(parser: CommandParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="only count what would change")
    parser.add_argument(
        "--yes", "--noinput", "--no-input", dest="yes", action="store_true", help="do not ask for confirmation"
    )


def add_database_option(parser: CommandParser) -> None:
    """``--database ALIAS`` (repeatable): which of the queue's databases a report reads."""
    parser.add_argument(
        "--database",
        action="append",
        default=[],
        metavar="ALIAS",
        help="read only database ALIAS (repeatable; default: every database of SQLQUEUE['DATABASE'] and "
        "SQLQUEUE['TOPIC_DATABASES'], or --topic's own)",
    )


def chosen_databases(only: list[str], topic: str | None = None) -> list[str]:
    """The aliases a report reads: ``only`` (checked), else ``topic``'s database, else every one."""
    from django_sqlqueue.conf import get_settings

    conf = get_settings()
    unknown = [alias for alias in only if alias not in conf.databases]
    if unknown:
        raise CommandError(
            f"--database {', '.join(unknown)}: not a database of the queue (known: {', '.join(conf.databases)}; "
            "SQLQUEUE['DATABASE'] and the aliases of SQLQUEUE['TOPIC_DATABASES'])."
        )
    if only:
        return list(dict.fromkeys(only))
    return [conf.database_for(topic)] if topic is not None else conf.databases


def add_one_database_option(parser: CommandParser) -> None:
    """``--database ALIAS`` (once): the database an action runs on, when not its topic's own."""
    parser.add_argument(
        "--database",
        metavar="ALIAS",
        help="run on database ALIAS (default: the topic's own database under SQLQUEUE['TOPIC_DATABASES'], "
        "else SQLQUEUE['DATABASE'])",
    )


def one_database(options: dict[str, Any]) -> str | None:
    """The ``--database`` alias of ``add_one_database_option`` (checked), or None."""
    given = options.get("database")
    return None if given is None else chosen_databases([given])[0]
