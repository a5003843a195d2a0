"""``manage.py queue_dlq list|replay|purge``: dead letters from the command line (``ops.deadletters``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.management.base import CommandError, CommandParser

from django_sqlqueue import ops

from . import _args
from ._console import Subcommand, SubcommandCommand, destructive, parse_time


def _filters(p: CommandParser) -> None:
    p.add_argument("--topic", type=_args.topic, help="original topic (its dead letters live in <topic><DLQ_SUFFIX>)")
    p.add_argument("--group", type=_args.group, help="the consumer group that failed them")
    p.add_argument("--error", type=_args.text(), help="exception class, e.g. ValueError or myapp.errors.Timeout")
    p.add_argument("--failed-after", type=_args.time, help="ISO 8601 time (UTC if no offset)")
    p.add_argument("--failed-before", type=_args.time, help="ISO 8601 time (UTC if no offset)")


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
    page = ops.list_dead_letters(_filter(o), cursor=o.get("cursor"), limit=o["limit"])
    rows = [
        (
            d.seq,
            d.failed_at.strftime("%Y-%m-%d %H:%M:%S") if d.failed_at else None,
            d.original_topic,
            d.group,
            d.original_id,
            d.failure_count,
            d.error_class,
        )
        for d in page.items
    ]
    lines = cmd.table(("seq", "failed at", "topic", "group", "original id", "attempts", "error"), rows)
    if page.next_cursor:
        lines.append(f"more: --cursor {page.next_cursor}")
    cmd.emit(o, {"items": [d.as_dict() for d in page.items], "next_cursor": page.next_cursor}, lines)


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
        count = len(o["seq"]) if o.get("seq") else ops.count_dead_letters(f)
        what = f"{count} dead letter(s)" + ("" if o.get("seq") else f" matching {f.describe()}")
        if not o["dry_run"]:
            cmd.confirm(o, f"{action.capitalize()} {what}?")
        single, matching = {"replay": (ops.replay, ops.replay_matching), "purge": (ops.purge, ops.purge_matching)}[
            action
        ]
        kwargs = {"actor": "cli", "batch_size": o["batch_size"], "dry_run": o["dry_run"]}
        result = single(o["seq"], **kwargs) if o.get("seq") else matching(f, **kwargs)
        cmd.emit(o, result, result.describe().capitalize() + ".")

    return run


class Command(SubcommandCommand):
    help = "Dead letters: list, replay to the failing group only, purge."
    SUBCOMMANDS: ClassVar[dict[str, Subcommand]] = {
        "list": ("list dead letters, newest first", add_list, do_list),
        "replay": ("replay dead letters to the consumer group that failed them", add_bulk, _bulk("replay")),
        "purge": ("delete dead letters", add_bulk, _bulk("purge")),
    }
