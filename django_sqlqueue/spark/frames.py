"""Messages as a DataFrame, from the Python data source or Spark's JDBC reader.

:func:`load_messages` is the one entry point of the pipelines; ``engine`` picks how:

- ``python``: the ``sqlqueue`` data source (any database Django supports; runs the
  sequencer first; splits by partition and offset range);
- ``jdbc``: Spark's own JDBC reader with the MariaDB driver (Debian's
  ``libmariadb-java``), MySQL/MariaDB only. It read 1.3-2.4x faster than the Python
  source on a million rows here, because rows go from the JVM to Parquet without
  passing through Python. Splits are ``seq`` (primary key) ranges. It reads only
  sequenced messages too, and the sequencer is run first.
- ``auto``: ``jdbc`` when the database is MySQL/MariaDB and the driver jar is on
  Spark's classpath, else ``python``.

Both return the same columns and types (``schema.MESSAGE_COLUMNS``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from .databases import choose_database
from .options import SparkOptionError, jdbc_url
from .schema import COLUMN_NAMES, MESSAGE_COLUMNS

ENGINES = ("auto", "python", "jdbc")


def choose_engine(spark: Any, options: Mapping[str, str], engine: str) -> str:
    """Resolve ``auto``; refuse ``jdbc`` where it cannot work."""
    if engine not in ENGINES:
        raise SparkOptionError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}.")
    mysql = options.get("engine", "").endswith("mysql")
    has_jar = "mariadb-java-client" in (spark.conf.get("spark.jars", "") or "")
    if engine == "auto":
        return "jdbc" if mysql and has_jar else "python"
    if engine == "jdbc" and not mysql:
        raise SparkOptionError("engine 'jdbc' reads MySQL/MariaDB only; use engine 'python'.")
    if engine == "jdbc" and not has_jar:
        raise SparkOptionError(
            "engine 'jdbc' needs the MariaDB JDBC driver on Spark's classpath (apt-get install libmariadb-java, "
            "or set SQLQUEUE_JDBC_JAR); use engine 'python'."
        )
    return engine


def _iso(moment: dt.datetime | None) -> str:
    return moment.isoformat() if moment else ""


def load_messages(
    spark: Any,
    options: Mapping[str, str],
    topics: Sequence[str],
    *,
    engine: str = "auto",
    start_time: dt.datetime | None = None,
    end_time: dt.datetime | None = None,
    splits: int | None = None,
) -> Any:
    """Return the sequenced messages of ``topics`` (``published_at`` in ``[start_time, end_time)``)."""
    if not topics:
        raise SparkOptionError("load_messages: no topic given.")
    # The topics' database (or option ``using``): the JDBC reader connects to it too.
    options = choose_database(options, topics, "batch read")
    engine = choose_engine(spark, options, engine)
    if engine == "python":
        reader = spark.read.format("sqlqueue").options(**options).option("topic", ",".join(topics))
        if start_time:
            reader = reader.option("startTime", _iso(start_time))
        if end_time:
            reader = reader.option("endTime", _iso(end_time))
        return reader.load()
    return _load_jdbc(spark, options, topics, start_time, end_time, splits)


def _load_jdbc(
    spark: Any,
    options: Mapping[str, str],
    topics: Sequence[str],
    start_time: dt.datetime | None,
    end_time: dt.datetime | None,
    splits: int | None,
) -> Any:
    from .runtime import driver_database

    with driver_database(options) as alias:
        from ..db.store.log import LogStore
        from .reader import run_sequencer

        run_sequencer(alias, topics)
        # The subquery of Spark's JDBC reader: quoted by the database's dialect, values inlined.
        bounds = LogStore(alias).seq_bounds(topics, COLUMN_NAMES, start_time, end_time)
    reader = (
        spark.read.format("jdbc")
        .option("url", jdbc_url(options))
        .option("driver", "org.mariadb.jdbc.Driver")
        .option("user", options.get("user", ""))
        .option("password", options.get("password", ""))
        .option("dbtable", bounds.table_sql)
        .option("fetchsize", "10000")
    )
    if bounds.count and bounds.high is not None:
        parts = splits or max(1, min(64, bounds.count // 100_000 + spark.sparkContext.defaultParallelism))
        reader = (
            reader.option("partitionColumn", "seq")
            .option("lowerBound", str(bounds.low))
            .option("upperBound", str(bounds.high + 1))
            .option("numPartitions", str(parts))
        )
    df = reader.load()
    # Backticks here are Spark SQL's identifier quoting, not the database's.
    return df.selectExpr(*[f"CAST(`{name}` AS {type_name}) AS `{name}`" for name, type_name in MESSAGE_COLUMNS])
