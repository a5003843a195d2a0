"""A SparkSession configured for the queue's pipelines."""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import Any

#: Where Debian's libmariadb-java puts the MariaDB JDBC driver.
JDBC_JAR_CANDIDATES = ("/usr/share/java/mariadb-java-client.jar", "/usr/share/java/mariadb-java-client-*.jar")


def jdbc_jar() -> str | None:
    """Return the MariaDB JDBC driver jar (``SQLQUEUE_JDBC_JAR`` or Debian's libmariadb-java), if any."""
    configured = os.environ.get("SQLQUEUE_JDBC_JAR")
    if configured:
        return configured if os.path.exists(configured) else None
    for pattern in JDBC_JAR_CANDIDATES:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def under_spark_submit() -> bool:
    """Whether this process was started by ``spark-submit`` (its JVM gateway already exists)."""
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


def build_session(master: str | None = None, app_name: str = "sqlqueue", conf: Mapping[str, str] | None = None) -> Any:
    """Return a SparkSession on ``master`` with the session time zone pinned to UTC.

    ``master`` None means: the one ``spark-submit`` was given, or ``local[*]`` when the
    process was not started by ``spark-submit``.

    Django sets the process time zone from ``TIME_ZONE``; the queue stores UTC, so Spark
    must not shift timestamps by the driver's zone. The JDBC driver jar, when present,
    is put on the classpath for :func:`~django_sqlqueue.spark.frames.load_messages`.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError(
            f'{exc}: the Spark pipelines need the spark extra: pip install "django-sqlqueue[spark]"'
        ) from exc

    builder = SparkSession.builder.appName(app_name)
    if master or not under_spark_submit():
        builder = builder.master(master or "local[*]")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    jar = jdbc_jar()
    if jar:
        builder = builder.config("spark.jars", jar)
    for name, value in (conf or {}).items():
        builder = builder.config(name, value)
    session = builder.getOrCreate()
    session.conf.set("spark.sql.session.timeZone", "UTC")
    return session
