"""Spark's discovery hook: a top-level ``pyspark_<name>`` module exporting ``DefaultSource``.

With django-sqlqueue installed (``[spark]`` extra), ``format("sqlqueue")`` works without
``spark.dataSource.register(...)``.
"""

from django_sqlqueue.spark.source import SQLQueueDataSource as DefaultSource

__all__ = ["DefaultSource"]
