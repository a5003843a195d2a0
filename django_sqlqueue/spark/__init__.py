"""PySpark integration (``pip install django-sqlqueue[spark]``): the ``sqlqueue`` data source.

``spark.read.format("sqlqueue")``, ``df.write.format("sqlqueue")`` and
``spark.readStream.format("sqlqueue")`` work without ``register()`` once the package is
installed: Spark discovers the top-level module ``pyspark_sqlqueue``. :func:`register`
does it explicitly (e.g. when the package is shipped with ``--py-files``).
"""

from __future__ import annotations

from typing import Any

from .dataloss import DataLoss
from .options import SparkOptionError, jdbc_url, sqlqueue_options
from .payload import PayloadSchemaMismatch

__all__ = ["DataLoss", "PayloadSchemaMismatch", "SparkOptionError", "jdbc_url", "register", "sqlqueue_options"]


def register(spark: Any) -> None:
    """Register the ``sqlqueue`` data source with ``spark``."""
    from .source import SQLQueueDataSource

    spark.dataSource.register(SQLQueueDataSource)
