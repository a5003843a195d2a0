"""``manage.py queue_topic list|purge|repartition``: topics, including those nobody consumes (``ops.topics``).

Subcommands are entries of ``Command.SUBCOMMANDS``; add one there (its logic in
``django_sqlqueue.ops``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.management.base import CommandParser

from django_sqlqueue import ops

from . import _args
from ._console import (
    Subcommand,
    SubcommandCommand,
    add_database_option,
    add_one_database_option,
    chosen_databases,
    destructive,
    one_database,
)


def add_list(p: CommandParser) -> None:
    p.add_argument("--unconsumed", action="store_true", help="only topics no group consumes")
    add_database_option(p)


def do_list(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    aliases = chosen_databases(o["database"])
    topics = [t for db in aliases for t in ops.list_topics(using=db) if t.unconsumed or not o["unconsumed"]]
    where = len(aliases) > 1  # several databases: a first column names each topic's
    rows = [
        ((t.database,) if where else ())
        + (
            t.topic,
            t.partitions if t.registered else "unregistered",
            ",".join(t.consumed_by) or ("no group (by design)" if t.dead_letter_topic else "NOBODY"),
            "dead letters" if t.dead_letter_topic else "",
        )
        for t in topics
    ]
    head = (("database",) if where else ()) + ("topic", "partitions", "consumed by", "kind")
    cmd.emit(o, topics, cmd.table(head, rows) if topics else "no topics")


def add_purge(p: CommandParser) -> None:
    p.add_argument("topic", type=_args.topic)
    p.add_argument(
        "--batch-size",
        type=_args.batch_size,
        default=1000,
        help=f"messages deleted per transaction, 1 to {_args.MAX_BATCH} (default 1000)",
    )
    add_one_database_option(p)
    destructive(p)


def do_purge(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    using = one_database(o)
    preview = ops.purge_topic(o["topic"], dry_run=True, using=using)
    if o["dry_run"]:
        cmd.emit(o, preview, f"would delete {preview.messages} message(s) of {o['topic']}")
        return
    cmd.confirm(o, f"Delete all {preview.messages} message(s) of topic {o['topic']}?")
    done = ops.purge_topic(o["topic"], batch_size=o["batch_size"], using=using)
    cmd.emit(
        o,
        done,
        f"deleted {done.messages} message(s) of {o['topic']} ({done.delivery_states} delivery state "
        f"row(s), {done.leases} lease(s))",
    )


def add_repartition(p: CommandParser) -> None:
    p.add_argument("topic", type=_args.topic)
    p.add_argument("partitions", type=_args.partition_count, help=f"1 to {_args.MAX_PARTITIONS}")
    add_one_database_option(p)
    destructive(p)


def do_repartition(cmd: SubcommandCommand, o: dict[str, Any]) -> None:
    using = one_database(o)
    preview = ops.repartition_topic(o["topic"], o["partitions"], dry_run=True, using=using)
    old = "unregistered" if preview.old is None else preview.old
    if o["dry_run"]:
        cmd.emit(o, preview, f"would change {o['topic']} from {old} to {preview.new} partitions")
        return
    cmd.confirm(
        o,
        f"Change topic {o['topic']} from {old} to {preview.new} partitions? Keys move to other partitions: "
        "a key's messages from before and after the change are not ordered with each other.",
    )
    done = ops.repartition_topic(o["topic"], o["partitions"], using=using)
    cmd.emit(o, done, f"{o['topic']}: {old} -> {done.new} partitions; restart the workers")


class Command(SubcommandCommand):
    help = "Topics: list every topic (also those nobody consumes), purge one, change its partition count."
    SUBCOMMANDS: ClassVar[dict[str, Subcommand]] = {
        "list": ("list every topic in the log, registered or consumed", add_list, do_list),
        "purge": ("delete every message of a topic", add_purge, do_purge),
        "repartition": (
            "change a topic's partition count (set SQLQUEUE['TOPICS'] first)",
            add_repartition,
            do_repartition,
        ),
    }
