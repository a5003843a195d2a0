"""``manage.py queue_pipeline backfill|export|replay|report``: the queue's Spark pipelines.

Needs the ``spark`` extra (``pip install django-sqlqueue[spark]``). ``--master`` picks the
cluster; without it, the master given to ``spark-submit`` (when the command runs under it),
else ``local[*]``. The
database connection is taken from ``settings.DATABASES``: no credentials on the command line.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_sqlqueue.exceptions import SQLQueueError
from django_sqlqueue.rules.timeparse import parse_time

logger = logging.getLogger("django_sqlqueue.pipeline")


def _time(value: str) -> dt.datetime:
    try:
        return parse_time(value)
    except ValueError:
        raise CommandError(f"not an ISO 8601 time: {value!r} (e.g. 2026-11-22T08:00 -- naive times are UTC)") from None


class Command(BaseCommand):
    help = "Run a Spark pipeline on the queue: backfill, export, replay or report."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="pipeline", required=True, parser_class=type(parser))

        def common(p: Any) -> None:
            p.add_argument(
                "--master", default="local[*]", help="Spark master (default local[*]; e.g. spark://host:7077)"
            )
            p.add_argument("--database", default=None, help="database alias (default SQLQUEUE['DATABASE'])")
            p.add_argument(
                "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)"
            )

        p = sub.add_parser(
            "backfill", help="publish the rows of Parquet/JSON/CSV files to a topic", called_from_command_line=False
        )
        p.add_argument("source", help="a file or directory (any path Spark reads: local, hdfs://, s3a://...)")
        p.add_argument("--topic", required=True)
        p.add_argument("--format", dest="fmt", default="parquet", choices=["parquet", "json", "csv"])
        p.add_argument("--id-column", help="column of unique message ids (default: ids are content hashes)")
        p.add_argument("--key-column", help="column of message keys (ordering scope)")
        p.add_argument("--payload-column", help="the payload column (default: a struct of all other columns)")
        p.add_argument("--batch-size", type=int, default=2000, help="rows per INSERT transaction")
        common(p)

        p = sub.add_parser(
            "export", help="write topics (or DLQ topics) to Parquet, by topic and date", called_from_command_line=False
        )
        p.add_argument("--topic", action="append", required=True, help="topic to export (repeatable)")
        p.add_argument("--dlq", action="store_true", help="export the topics' dead-letter topics instead")
        p.add_argument("--output", required=True, help="output directory (topic=<t>/date=<d>/ below it)")
        p.add_argument("--since", type=_time, help="published at or after (ISO 8601, UTC if naive)")
        p.add_argument("--until", type=_time, help="published before")
        p.add_argument("--engine", default="auto", choices=["auto", "jdbc", "python"])
        p.add_argument("--overwrite", action="store_true", help="replace the (topic, date) directories written")
        common(p)

        p = sub.add_parser(
            "replay",
            help="replay a time range of a topic into another topic or a new group",
            called_from_command_line=False,
        )
        p.add_argument("--topic", required=True)
        p.add_argument("--since", type=_time, required=True)
        p.add_argument("--until", type=_time, help="end of the range (topic replays only)")
        target = p.add_mutually_exclusive_group(required=True)
        target.add_argument("--to-topic", help="publish the range to this topic")
        target.add_argument("--group", help="start this NEW consumer group at --since")
        p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        common(p)

        p = sub.add_parser("report", help="write an HTML report with plots", called_from_command_line=False)
        p.add_argument("--output", required=True, help="HTML file to write")
        p.add_argument("--hours", type=int, default=48, help="hours of history in 'messages per hour'")
        common(p)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            from django_sqlqueue.spark import sqlqueue_options
            from django_sqlqueue.spark.session import build_session
        except ImportError as exc:
            raise CommandError(
                f"queue_pipeline needs the spark extra (pip install django-sqlqueue[spark]): {exc}"
            ) from exc
        pipeline = options["pipeline"]
        if pipeline == "replay" and options["group"]:
            # Not a Spark job: positions a new group's watermarks.
            self._replay_group(options)
            return
        try:
            source_options = sqlqueue_options(options["database"])
        except SQLQueueError as exc:
            raise CommandError(str(exc)) from exc
        conf = {}
        for item in options["conf"]:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise CommandError(f"--conf takes KEY=VALUE, got {item!r}")
            conf[name.strip()] = value
        spark = build_session(options["master"], f"sqlqueue-{pipeline}", conf)
        started = time.monotonic()
        try:
            getattr(self, f"_{pipeline}")(spark, source_options, options)
        except SQLQueueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"{pipeline} finished in {time.monotonic() - started:.1f}s")

    def _backfill(self, spark: Any, source_options: dict[str, str], options: dict[str, Any]) -> None:
        from django_sqlqueue.spark.pipelines import backfill

        result = backfill(
            spark,
            source_options,
            source=options["source"],
            topic=options["topic"],
            fmt=options["fmt"],
            id_column=options["id_column"],
            key_column=options["key_column"],
            payload_column=options["payload_column"],
            batch_size=options["batch_size"],
        )
        self.stdout.write(
            f"backfill: {result.rows} source row(s), {result.published} new message(s) in {options['topic']!r} "
            f"({result.rows - result.published} already published or identical)"
        )

    def _export(self, spark: Any, source_options: dict[str, str], options: dict[str, Any]) -> None:
        from django_sqlqueue.conf import get_settings
        from django_sqlqueue.spark.pipelines import export

        topics = options["topic"]
        if options["dlq"]:
            topics = [get_settings().dlq_topic(t) for t in topics]
        counts = export(
            spark,
            source_options,
            topics=topics,
            output=options["output"],
            engine=options["engine"],
            start_time=options["since"],
            end_time=options["until"],
            overwrite=options["overwrite"],
        )
        for topic in topics:
            self.stdout.write(f"export: {topic}: {counts.get(topic, 0)} message(s) -> {options['output']}")

    def _replay(self, spark: Any, source_options: dict[str, str], options: dict[str, Any]) -> None:
        from django_sqlqueue.spark.pipelines import replay_to_topic

        count = replay_to_topic(
            spark,
            source_options,
            topic=options["topic"],
            target=options["to_topic"],
            start_time=options["since"],
            end_time=options["until"],
        )
        logger.info("replayed %s message(s) of %s into %s", count, options["topic"], options["to_topic"])
        self.stdout.write(f"replay: {count} message(s) of {options['topic']!r} published to {options['to_topic']!r}")

    def _replay_group(self, options: dict[str, Any]) -> None:
        from django_sqlqueue.spark.pipelines import replay_to_group

        if options["until"]:
            raise CommandError("--until applies to --to-topic only: a consumer group reads on from --since.")
        question = (
            f"Start NEW consumer group {options['group']!r} on {options['topic']!r} at messages published since "
            f"{options['since'].isoformat()}? [y/N] "
        )
        if not options["yes"] and input(question).strip().lower() not in ("y", "yes"):
            raise CommandError("cancelled")
        try:
            marks = replay_to_group(options["topic"], options["group"], options["since"], using=options["database"])
        except SQLQueueError as exc:
            raise CommandError(str(exc)) from exc
        logger.warning("queue_pipeline replay: group %s starts %s at %s", options["group"], options["topic"], marks)
        self.stdout.write(
            f"replay: group {options['group']!r} starts {options['topic']!r} in {len(marks)} partition(s)"
        )

    def _report(self, spark: Any, source_options: dict[str, str], options: dict[str, Any]) -> None:
        from django_sqlqueue.spark.report import write_report

        data = write_report(spark, source_options, options["output"], hours=options["hours"], using=options["database"])
        self.stdout.write(
            f"report: {options['output']} ({len(data.per_hour)} topic(s), {len({g for g, *_ in data.lag})} group(s))"
        )
