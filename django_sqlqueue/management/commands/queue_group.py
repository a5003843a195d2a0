"""``manage.py queue_group list|pause|resume|drop|seek``: consumer groups (``ops.groups``, ``.seek``, ``.pausing``)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.management.base import CommandError, CommandParser

from django_sqlqueue import ops
from django_sqlqueue.conf import get_settings
from django_sqlqueue.ops.pausing import REASON_LENGTH

from . import _args
from ._console import (
    Subcommand,
    SubcommandCommand,
    add_database_option,
    add_one_database_option,
    chosen_databases,
    destructive,
    one_database,
    parse_time,
)


def add_list(p: CommandParser) -> None:
    p.add_argument("--group", type=_args.group)
    p.add_argument("--topic", type=_args.topic)
    p.add_argument("--partitions", action="store_true", help="one row per partition")
    add_database_option(p)


def do_list(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    aliases = chosen_databases(o["database"], o.get("topic"))
    groups = [g for db in aliases for g in ops.list_groups(o.get("group"), o.get("topic"), using=db)]
    # Several databases: each row starts with its database ("database/group:topic" per partition).
    where = len(aliases) > 1
    if o["partitions"]:
        data = {
            (f"{g.database}/" if where else "") + f"{g.group}:{g.topic}": ops.group_offsets(
                g.group, g.topic, using=g.database
            )
            for g in groups
        }
        rows = [
            (key, r.partition, r.head, r.watermark, r.lag, r.in_flight, r.retrying, r.leased_by)
            for key, parts in data.items()
            for r in parts
        ]
        head = ("database/" if where else "") + "group:topic"
        cmd.emit(
            o,
            data,
            cmd.table((head, "partition", "head", "watermark", "lag", "in flight", "retrying", "leased by"), rows),
        )
        return
    summary = [
        ((g.database,) if where else ())
        + (g.group, g.topic, g.partitions, g.lag, g.live_subscribers, "paused" if g.paused else "")
        for g in groups
    ]
    columns = ("group", "topic", "partitions", "lag", "live subscribers", "state")
    cmd.emit(
        o,
        groups,
        cmd.table((("database",) if where else ()) + columns, summary) if groups else "no consumer groups",
    )


def add_pair(p: CommandParser) -> None:
    p.add_argument("group", type=_args.group)
    p.add_argument("topic", type=_args.topic)
    add_one_database_option(p)


def add_pause(p: CommandParser) -> None:
    add_pair(p)
    p.add_argument("--reason", default="", type=_args.text(REASON_LENGTH), help=f"at most {REASON_LENGTH} characters")


def do_pause(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    changed = ops.pause(o["group"], o["topic"], by="cli", reason=o["reason"], using=one_database(o))
    cmd.emit(o, {"paused": changed}, f"paused {o['group']} on {o['topic']}" if changed else "already paused")


def do_resume(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    changed = ops.resume(o["group"], o["topic"], using=one_database(o))
    cmd.emit(o, {"resumed": changed}, f"resumed {o['group']} on {o['topic']}" if changed else "was not paused")


def add_drop(p: CommandParser) -> None:
    p.add_argument("group", type=_args.group)
    p.add_argument("--topic", type=_args.topic, help="only the group's consumption of this topic")
    p.add_argument("--force", action="store_true", help="even with live subscribers")
    p.add_argument(
        "--database",
        metavar="ALIAS",
        help="only in database ALIAS (default: --topic's database; without --topic, every database)",
    )
    destructive(p)


def do_drop(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    using = one_database(o)
    preview = ops.drop_group(o["group"], topic=o.get("topic"), force=o["force"], dry_run=True, using=using)
    lines = [f"{table}: {n}" for table, n in preview.rows.items()] + _where(preview)
    if o["dry_run"]:
        cmd.emit(o, preview, [f"would delete {preview.total} row(s) of group {o['group']}:", *lines])
        return
    cmd.confirm(
        o, f"Drop group {o['group']}" + (f" on {o['topic']}" if o.get("topic") else "") + f" ({preview.total} rows)?"
    )
    done = ops.drop_group(o["group"], topic=o.get("topic"), force=o["force"], using=using)
    cmd.emit(
        o,
        done,
        [
            f"dropped {done.total} row(s) of group {o['group']}:",
            *[f"{t}: {n}" for t, n in done.rows.items()],
            *_where(done),
        ],
    )


def _where(drop: ops.GroupDrop) -> list[str]:
    """The databases of a drop, when the queue has several (one line), else nothing."""
    return [f"in database(s): {', '.join(drop.databases)}"] if len(get_settings().databases) > 1 else []


def add_seek(p: CommandParser) -> None:
    add_pair(p)
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-offset", type=_args.offset, help="new watermark: the next delivered offset is N + 1")
    to.add_argument(
        "--to-time", type=_args.time, help="deliver from the first message published at or after this ISO 8601 time"
    )
    to.add_argument("--to-earliest", action="store_true", help="everything still in the log again")
    to.add_argument("--to-latest", action="store_true", help="skip everything up to the head")
    p.add_argument("--partitions", type=_args.partitions, help="comma-separated partitions (default: all)")
    destructive(p)


def do_seek(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"partitions": ops.parse_partitions(o.get("partitions")), "using": one_database(o)}
    if o.get("to_offset") is not None:
        kwargs["offset"] = o["to_offset"]
    elif o.get("to_time"):
        kwargs["time"] = parse_time(o["to_time"])
    elif o.get("to_earliest"):
        kwargs["position"] = "earliest"
    elif o.get("to_latest"):
        kwargs["position"] = "latest"
    else:  # pragma: no cover - argparse requires one
        raise CommandError("pass one of --to-offset/--to-time/--to-earliest/--to-latest.")
    plan = ops.plan_seek(o["group"], o["topic"], **kwargs)
    rows = cmd.table(
        ("partition", "head", "watermark", "new watermark", "redelivered", "skipped"),
        [(r.partition, r.head, r.watermark, r.target, *r.shown()) for r in plan.partitions],
    )
    if o["dry_run"]:
        cmd.emit(o, plan, [*rows, "(dry run) " + plan.describe()])
        return
    cmd.confirm(o, plan.describe().capitalize() + ". Apply?")
    done = ops.seek(o["group"], o["topic"], **kwargs)
    cmd.emit(
        o,
        done,
        [
            *cmd.table(
                ("partition", "old watermark", "new watermark", "redelivered", "skipped"),
                [(r.partition, r.watermark, r.target, *r.shown()) for r in done.partitions],
            ),
            done.describe(),
        ],
    )


class Command(SubcommandCommand):
    help = "Consumer groups: list, pause/resume a topic, drop a retired group, seek (rewind/fast-forward)."
    SUBCOMMANDS: ClassVar[dict[str, Subcommand]] = {
        "list": ("list groups with lag (--partitions: per partition)", add_list, do_list),
        "pause": ("pause a group's consumption of a topic", add_pause, do_pause),
        "resume": ("resume a paused group's consumption of a topic", add_pair, do_resume),
        "drop": ("forget a retired group so garbage collection can proceed", add_drop, do_drop),
        "seek": ("move a group's watermarks on a topic to an offset, a time, earliest or latest", add_seek, do_seek),
    }
