"""``manage.py queue_pipeline backfill|export|replay|report``: the queue's Spark pipelines.

Needs the ``spark`` extra (``pip install "django-sqlqueue[spark]"``) except ``replay --group``, which
only positions a new group's watermarks; without it the command says so. ``--master`` picks the
cluster; without it, the master given to ``spark-submit`` (when the command runs under it),
else ``local[*]``. The
database connection is taken from ``settings.DATABASES``: no credentials on the command line.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_sqlqueue.exceptions import SQLQueueError

from . import _args
from ._console import confirm

logger = logging.getLogger("django_sqlqueue.pipeline")

#: What each pipeline imports of the ``spark`` extra (pyproject.toml).
NEEDS = {
    "backfill": ("pyspark", "pyarrow"),
    "export": ("pyspark", "pyarrow"),
    "replay": ("pyspark", "pyarrow"),
    "report": ("pyspark", "pyarrow", "matplotlib"),
}
INSTALL_HINT = 'pip install "django-sqlqueue[spark]" (and Java 17 for Spark)'
text = _args.text()


def database_alias(value: str) -> str:
    """An argparse type: an alias of ``settings.DATABASES``."""
    from django.conf import settings

    if value not in settings.DATABASES:
        known = ", ".join(sorted(settings.DATABASES))
        raise argparse.ArgumentTypeError(f"must be an alias of settings.DATABASES ({known}), got {_args.shown(value)}")
    return value


def spark_setting(value: str) -> str:
    """An argparse type: ``KEY=VALUE`` of a Spark setting (``--conf``)."""
    value = text(value)
    name, sep, _ = value.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {_args.shown(value)}")
    return value


def missing_modules(pipeline: str) -> list[str]:
    """The modules ``pipeline`` needs that are not installed."""
    return [name for name in NEEDS[pipeline] if importlib.util.find_spec(name) is None]


class Command(BaseCommand):
    help = "Run a Spark pipeline on the queue: backfill, export, replay or report."

    def add_arguments(self, parser: CommandParser) -> None:
        # The subparsers inherit called_from_command_line (Django's CommandParser.add_subparsers):
        # from the command line an argument error is argparse's usage and one line, exit 2.
        sub = parser.add_subparsers(dest="pipeline", required=True, parser_class=type(parser))

        def common(p: Any) -> None:
            p.add_argument(
                "--master",
                type=text,
                default="local[*]",
                help="Spark master (default local[*]; e.g. spark://host:7077)",
            )
            p.add_argument(
                "--database", type=database_alias, default=None, help="database alias (default SQLQUEUE['DATABASE'])"
            )
            p.add_argument(
                "--conf",
                type=spark_setting,
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help="a Spark setting (repeatable)",
            )

        p = sub.add_parser("backfill", help="publish the rows of Parquet/JSON/CSV files to a topic")
        p.add_argument(
            "source", type=text, help="a file or directory (any path Spark reads: local, hdfs://, s3a://...)"
        )
        p.add_argument("--topic", type=_args.topic, required=True)
        p.add_argument("--format", dest="fmt", default="parquet", choices=["parquet", "json", "csv"])
        p.add_argument("--id-column", type=text, help="column of unique message ids (default: ids are content hashes)")
        p.add_argument("--key-column", type=text, help="column of message keys (ordering scope)")
        p.add_argument(
            "--payload-column", type=text, help="the payload column (default: a struct of all other columns)"
        )
        p.add_argument(
            "--batch-size",
            type=_args.batch_size,
            default=2000,
            help=f"rows per INSERT transaction, 1 to {_args.MAX_BATCH} (default 2000)",
        )
        common(p)

        p = sub.add_parser("export", help="write topics (or DLQ topics) to Parquet, by topic and date")
        p.add_argument("--topic", type=_args.topic, action="append", required=True, help="topic to export (repeatable)")
        p.add_argument("--dlq", action="store_true", help="export the topics' dead-letter topics instead")
        p.add_argument("--output", type=text, required=True, help="output directory (topic=<t>/date=<d>/ below it)")
        p.add_argument("--since", type=_args.time, help="published at or after (ISO 8601, UTC if naive)")
        p.add_argument("--until", type=_args.time, help="published before")
        p.add_argument("--engine", default="auto", choices=["auto", "jdbc", "python"])
        p.add_argument("--overwrite", action="store_true", help="replace the (topic, date) directories written")
        common(p)

        p = sub.add_parser("replay", help="replay a time range of a topic into another topic or a new group")
        p.add_argument("--topic", type=_args.topic, required=True)
        p.add_argument("--since", type=_args.time, required=True)
        p.add_argument("--until", type=_args.time, help="end of the range (topic replays only)")
        target = p.add_mutually_exclusive_group(required=True)
        target.add_argument("--to-topic", type=_args.topic, help="publish the range to this topic")
        target.add_argument("--group", type=_args.group, help="start this NEW consumer group at --since")
        p.add_argument(
            "--yes", "--noinput", "--no-input", dest="yes", action="store_true", help="do not ask for confirmation"
        )
        common(p)

        p = sub.add_parser("report", help="write an HTML report with plots")
        p.add_argument("--output", type=text, required=True, help="HTML file to write")
        p.add_argument(
            "--hours",
            type=_args.bounded_int(1, _args.MAX_REPORT_HOURS),
            default=48,
            help=f"hours of history in 'messages per hour', 1 to {_args.MAX_REPORT_HOURS} (default 48)",
        )
        common(p)

    def handle(self, *args: Any, **options: Any) -> None:
        pipeline = options["pipeline"]
        if pipeline == "replay" and options["group"]:
            # Not a Spark job: positions a new group's watermarks.
            self._replay_group(options)
            return
        conf = {}
        for item in options["conf"]:  # parsed by spark_setting already, unless given to call_command
            name, _, value = _args.checked(item, "--conf", spark_setting).partition("=")
            conf[name.strip()] = value
        missing = missing_modules(pipeline)
        if missing:
            raise CommandError(
                f"queue_pipeline {pipeline} needs the spark extra ({', '.join(missing)} not installed): {INSTALL_HINT}."
            )
        from django_sqlqueue.spark import sqlqueue_options
        from django_sqlqueue.spark.session import build_session

        try:
            source_options = sqlqueue_options(options["database"])
        except SQLQueueError as exc:
            raise CommandError(str(exc)) from exc
        try:
            spark = build_session(options["master"], f"sqlqueue-{pipeline}", conf)
        except ImportError as exc:  # installed, but broken (e.g. a pyspark without its py4j)
            raise CommandError(f"queue_pipeline {pipeline}: {exc}: {INSTALL_HINT}.") from exc
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
        confirm(
            options,
            f"Start NEW consumer group {options['group']!r} on {options['topic']!r} at messages published since "
            f"{options['since'].isoformat()}?",
        )
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
