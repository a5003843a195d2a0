"""``manage.py queue_dlq list|replay|purge``: dead letters from the command line (``ops.deadletters``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.management.base import CommandError, CommandParser

from django_sqlqueue import ops
from django_sqlqueue.conf import get_settings

from . import _args
from ._console import Subcommand, SubcommandCommand, chosen_databases, destructive, parse_time, to_jsonable


def _filters(p: CommandParser) -> None:
    p.add_argument("--topic", type=_args.topic, help="original topic (its dead letters live in <topic><DLQ_SUFFIX>)")
    p.add_argument("--group", type=_args.group, help="the consumer group that failed them")
    p.add_argument("--error", type=_args.text(), help="exception class, e.g. ValueError or myapp.errors.Timeout")
    p.add_argument("--failed-after", type=_args.time, help="ISO 8601 time (UTC if no offset)")
    p.add_argument("--failed-before", type=_args.time, help="ISO 8601 time (UTC if no offset)")
    p.add_argument(
        "--database",
        metavar="ALIAS",
        help="the database to read (default: --topic's own; without --topic, every database of the queue)",
    )


def _databases(o: dict[str, Any]) -> list[str]:
    """The databases a subcommand reads: --database (checked), else --topic's, else every one."""
    return chosen_databases([o["database"]] if o.get("database") else [], o.get("topic"))


def _filter(o: dict[str, Any]) -> ops.DeadLetterFilter:
    return ops.DeadLetterFilter(
        topic=o.get("topic"),
        group=o.get("group"),
        error=o.get("error"),
        failed_after=parse_time(o.get("failed_after")),
        failed_before=parse_time(o.get("failed_before")),
    )


def add_list(p: CommandParser) -> None:
    _filters(p)
    p.add_argument("--limit", type=_args.limit, default=50, help=f"rows to print, 1 to {_args.MAX_LIMIT} (default 50)")
    p.add_argument("--cursor", type=_args.seq, help="continue below this seq (printed as next_cursor)")


def do_list(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    aliases = _databases(o)
    if o.get("cursor") is not None and len(aliases) > 1:
        # A seq is a position in one database's log: a cursor continues one database's list.
        raise CommandError(f"--cursor continues one database's list: pass --database (one of {', '.join(aliases)}).")
    pages = {
        db: ops.list_dead_letters(_filter(o), cursor=o.get("cursor"), limit=o["limit"], using=db) for db in aliases
    }
    if len(pages) == 1:
        (page,) = pages.values()
        lines = cmd.table(_HEAD, [_row(d) for d in page.items])
        if page.next_cursor:
            lines.append(f"more: --cursor {page.next_cursor}")
        cmd.emit(o, {"items": [d.as_dict() for d in page.items], "next_cursor": page.next_cursor}, lines)
        return
    # Several databases: a first column names each dead letter's (its seq is a position there).
    lines = cmd.table(("database", *_HEAD), [(db, *_row(d)) for db, page in pages.items() for d in page.items])
    lines += [f"more in {db}: --database {db} --cursor {p.next_cursor}" for db, p in pages.items() if p.next_cursor]
    data = {
        "items": [{"database": db, **d.as_dict()} for db, page in pages.items() for d in page.items],
        "next_cursors": {db: p.next_cursor for db, p in pages.items()},
    }
    cmd.emit(o, data, lines)


_HEAD = ("seq", "failed at", "topic", "group", "original id", "attempts", "error")


def _row(d: ops.DeadLetter) -> tuple[Any, ...]:
    return (
        d.seq,
        d.failed_at.strftime("%Y-%m-%d %H:%M:%S") if d.failed_at else None,
        d.original_topic,
        d.group,
        d.original_id,
        d.failure_count,
        d.error_class,
    )


def add_bulk(p: CommandParser) -> None:
    _filters(p)
    p.add_argument("--seq", type=_args.seq, nargs="+", help="dead letters by seq (from `list`)")
    p.add_argument("--all-matching", action="store_true", help="every dead letter matching the filters")
    p.add_argument(
        "--batch-size",
        type=_args.batch_size,
        default=ops.deadletters.DEFAULT_BATCH,
        help=f"dead letters per transaction, 1 to {_args.MAX_BATCH} (default {ops.deadletters.DEFAULT_BATCH})",
    )
    destructive(p)


def _bulk(action: str) -> Any:
    def run(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
        f = _filter(o)
        if bool(o.get("seq")) == bool(o.get("all_matching")):
            raise CommandError("pass either --seq N [N ...] or --all-matching (with filters).")
        aliases = _databases(o)
        if o.get("seq") and len(aliases) > 1:
            # A seq names a row of one database's log only: never guess which.
            raise CommandError(
                f"--seq: seqs are per database; pass --database (one of {', '.join(aliases)}) or --topic."
            )
        count = len(o["seq"]) if o.get("seq") else sum(ops.count_dead_letters(f, using=db) for db in aliases)
        what = f"{count} dead letter(s)" + ("" if o.get("seq") else f" matching {f.describe()}")
        if len(aliases) > 1 or aliases != [get_settings().DATABASE]:
            what += f" in database(s) {', '.join(aliases)}"
        if not o["dry_run"]:
            cmd.confirm(o, f"{action.capitalize()} {what}?")
        single, matching = {"replay": (ops.replay, ops.replay_matching), "purge": (ops.purge, ops.purge_matching)}[
            action
        ]
        kwargs = {"actor": "cli", "batch_size": o["batch_size"], "dry_run": o["dry_run"]}
        results = {
            db: single(o["seq"], using=db, **kwargs) if o.get("seq") else matching(f, using=db, **kwargs)
            for db in aliases
        }
        if len(results) == 1:
            (result,) = results.values()
            cmd.emit(o, result, result.describe().capitalize() + ".")
            return
        lines = [f"database={db}: {r.describe()}." for db, r in results.items()]
        cmd.emit(o, [{"database": db, **to_jsonable(r)} for db, r in results.items()], lines)

    return run


class Command(SubcommandCommand):
    help = "Dead letters: list, replay to the failing group only, purge."
    SUBCOMMANDS: ClassVar[dict[str, Subcommand]] = {
        "list": ("list dead letters, newest first", add_list, do_list),
        "replay": ("replay dead letters to the consumer group that failed them", add_bulk, _bulk("replay")),
        "purge": ("delete dead letters", add_bulk, _bulk("purge")),
    }
