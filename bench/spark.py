"""Spark pipelines: backfill and export throughput, each next to its baseline in the same run.

Run: ``.venv/bin/python bench/spark.py [--rows N] [--json results.json]`` (needs the
``spark`` extra and, for the JDBC baseline, Debian's ``libmariadb-java``).

- backfill: N rows from Parquet published through the ``sqlqueue`` data source on
  ``local[2]`` (two tasks writing in parallel, transactions of 2000 messages), next to
  ``publish_many`` from one process (batches of 2000) with the same payloads, on a
  freshly migrated database. Both publish with explicit ids (idempotent).
- export: the N messages of the backfilled topic (after the sequencer numbered them)
  written to Parquet by ``queue_pipeline export`` with the Python data source, next to
  Spark's JDBC reader (MariaDB driver, ``seq`` range splits) on the same table.

Each figure is one run (a million rows take minutes); the table shows rows/s and the
ratio to the baseline measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_spk_bench")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import ROOT, setup_django


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    n = args.rows

    setup_django()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    from django_sqlqueue import publish_many
    from django_sqlqueue.db.sequencer import sequence
    from django_sqlqueue.models import Message
    from django_sqlqueue.spark import sqlqueue_options
    from django_sqlqueue.spark.pipelines import backfill, export
    from django_sqlqueue.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="sqlqueue-bench-"))
    spark = build_session("local[2]", "sqlqueue-bench", {"spark.ui.enabled": "false", "spark.driver.memory": "2g"})
    spark.sparkContext.setLogLevel("ERROR")
    options = sqlqueue_options()
    results: dict[str, float] = {}
    try:
        source = str(work / "source.parquet")
        spark.range(n).selectExpr(
            "CAST(id AS STRING) AS id",
            "concat('customer-', CAST(id % 5000 AS STRING)) AS key",
            "id AS order_id",
            "concat('customer-', CAST(id % 5000 AS STRING)) AS customer",
            "CAST(round(rand(7) * 100, 2) AS STRING) AS total",
        ).repartition(2).write.parquet(source)

        # Baseline: publish_many from this one process, same rows.
        rows = [
            {
                "id": str(i),
                "key": f"customer-{i % 5000}",
                "payload": {"order_id": i, "customer": f"customer-{i % 5000}", "total": "42.00"},
            }
            for i in range(n)
        ]
        start = time.perf_counter()
        for lo in range(0, n, 2000):
            publish_many("baseline", rows[lo : lo + 2000])
        results["publish_many_rows_per_s"] = n / (time.perf_counter() - start)
        del rows
        print(f"publish_many, one process: {results['publish_many_rows_per_s']:,.0f} rows/s", flush=True)

        start = time.perf_counter()
        result = backfill(spark, options, source=source, topic="backfilled", id_column="id", key_column="key")
        results["spark_backfill_rows_per_s"] = n / (time.perf_counter() - start)
        assert result.published == n, result
        print(f"Spark backfill, local[2]: {results['spark_backfill_rows_per_s']:,.0f} rows/s", flush=True)

        start = time.perf_counter()
        sequence("backfilled")
        results["sequencer_rows_per_s"] = n / (time.perf_counter() - start)
        assert Message.objects.filter(topic="backfilled", offset__isnull=True).count() == 0

        for engine in ("jdbc", "python"):
            out = str(work / f"export-{engine}")
            start = time.perf_counter()
            counts = export(spark, options, topics=["backfilled"], output=out, engine=engine)
            results[f"export_{engine}_rows_per_s"] = n / (time.perf_counter() - start)
            assert counts == {"backfilled": n}, counts
            print(f"export to Parquet, {engine}: {results[f'export_{engine}_rows_per_s']:,.0f} rows/s", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"| pipeline ({n:,} rows, local[2]) | rows/s | ratio to baseline |")
    print("| --- | ---: | ---: |")
    base = results["publish_many_rows_per_s"]
    print(f"| publish_many, one process (baseline) | {base:,.0f} | 1.00 |")
    print(
        f"| Spark backfill (sqlqueue data source) | {results['spark_backfill_rows_per_s']:,.0f} | "
        f"{results['spark_backfill_rows_per_s'] / base:.2f} |"
    )
    jdbc = results["export_jdbc_rows_per_s"]
    print(f"| export, Spark JDBC reader (baseline) | {jdbc:,.0f} | 1.00 |")
    print(
        f"| export, sqlqueue data source | {results['export_python_rows_per_s']:,.0f} | "
        f"{results['export_python_rows_per_s'] / jdbc:.2f} |"
    )
    print(f"(sequencer, one call over the backfilled topic: {results['sequencer_rows_per_s']:,.0f} rows/s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
