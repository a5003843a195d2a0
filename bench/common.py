"""Shared benchmark setup: a dedicated, freshly migrated MariaDB database."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_URL = os.environ.get("BENCH_DATABASE_URL", "mysql://sqlqueue:sqlqueue@127.0.0.1:3306/sqlqueue_bench7")


def recreate_database(url: str, create: bool = True) -> None:
    """Drop and create the (MariaDB/MySQL or PostgreSQL) database ``url`` names (only drop it
    when ``create`` is false)."""
    import environ

    cfg = environ.Env.db_url_config(url)
    name = cfg["NAME"]
    if "mysql" in cfg["ENGINE"]:
        import MySQLdb

        server = MySQLdb.connect(
            host=cfg["HOST"], port=int(cfg["PORT"] or 3306), user=cfg["USER"], password=cfg["PASSWORD"] or ""
        )
        server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        if create:
            server.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        server.close()
    else:
        import psycopg

        with psycopg.connect(
            host=cfg["HOST"],
            port=int(cfg["PORT"] or 5432),
            user=cfg["USER"],
            password=cfg["PASSWORD"],
            dbname="postgres",
            autocommit=True,
        ) as server:
            server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            if create:
                server.execute(f'CREATE DATABASE "{name}"')


def setup_django(url: str = BENCH_URL) -> None:
    """Point Django at a freshly created bench database and migrate it."""
    sys.path.insert(0, str(ROOT))
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    recreate_database(url)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    truncate_queue()


def truncate_queue() -> None:
    from django.apps import apps
    from django.db import connection

    with connection.cursor() as cursor:
        for model in apps.get_app_config("django_sqlqueue").get_models():
            if not model._meta.managed:  # the console's placeholder has no table
                continue
            cursor.execute(f"TRUNCATE TABLE {model._meta.db_table}")


def raw_connection():
    """A plain mysqlclient connection to the bench database, READ COMMITTED, autocommit off."""
    import environ
    import MySQLdb

    cfg = environ.Env.db_url_config(BENCH_URL)
    conn = MySQLdb.connect(
        host=cfg["HOST"],
        port=int(cfg["PORT"] or 3306),
        user=cfg["USER"],
        password=cfg["PASSWORD"],
        database=cfg["NAME"],
        charset="utf8mb4",
    )
    conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    conn.autocommit(False)
    return conn


def key_for_partition(partition: int, partitions: int, prefix: str = "k") -> str:
    """The first key ``<prefix><i>`` that hashes to ``partition`` (CRC-32, as the engine does)."""
    import zlib

    i = 0
    while zlib.crc32(f"{prefix}{i}".encode()) % partitions != partition:
        i += 1
    return f"{prefix}{i}"


def partition_keys(partitions: int, prefix: str = "k") -> list[str]:
    """One key per partition: ``keys[p]`` hashes to partition ``p``."""
    return [key_for_partition(p, partitions, prefix) for p in range(partitions)]


def best_rate(fn: Callable[[], int], repeat: int = 3) -> tuple[float, list[float]]:
    """Run ``fn`` (returns messages written) ``repeat`` times; return median msgs/s and all."""
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), rates
