"""spark/session.py: the SparkSession of the pipelines -- UTC, and the JDBC driver when there is one."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_sqlqueue.spark import session


def test_the_jdbc_jar_is_the_configured_one_if_it_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jar = tmp_path / "driver.jar"
    monkeypatch.setenv("SQLQUEUE_JDBC_JAR", str(jar))
    assert session.jdbc_jar() is None  # named but missing: no jar, not Debian's either
    jar.write_bytes(b"")
    assert session.jdbc_jar() == str(jar)
    monkeypatch.delenv("SQLQUEUE_JDBC_JAR")
    monkeypatch.setattr(session, "JDBC_JAR_CANDIDATES", (str(tmp_path / "mariadb-java-client-*.jar"),))
    assert session.jdbc_jar() is None
    for version in ("3.1.4", "3.0.9"):
        (tmp_path / f"mariadb-java-client-{version}.jar").write_bytes(b"")
    assert session.jdbc_jar() == str(tmp_path / "mariadb-java-client-3.0.9.jar")  # the first, sorted


def test_spark_submit_is_told_by_its_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert not session.under_spark_submit()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "41234")
    assert session.under_spark_submit()


def test_a_built_session_reads_and_writes_utc(spark) -> None:
    # The tests' session is build_session's (tests/spark/conftest.py); getOrCreate returns it.
    again = session.build_session("local[2,2]", "sqlqueue-tests", {"spark.sql.shuffle.partitions": "4"})
    assert again.conf.get("spark.sql.session.timeZone") == "UTC"
    row = again.sql("SELECT CAST(TIMESTAMP '2026-01-31 12:00:00' AS STRING) AS t").collect()[0]
    assert row["t"] == "2026-01-31 12:00:00"
