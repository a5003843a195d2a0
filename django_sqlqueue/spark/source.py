"""The ``sqlqueue`` PySpark data source (``spark.read/write/readStream/writeStream.format("sqlqueue")``)."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)

from .options import SparkOptionError, get_str
from .payload import parse_mode
from .schema import message_schema


class SQLQueueDataSource(DataSource):
    """Messages of django-sqlqueue topics, read and published through Spark.

    See ``docs/spark.md`` for the options. Every method runs in a Spark Python worker;
    the database connection comes from the options (:func:`sqlqueue_options`).
    """

    @classmethod
    def name(cls) -> str:
        return "sqlqueue"

    def _payload_schema(self) -> str:
        return get_str(self.options, "payloadSchema")

    def schema(self) -> Any:
        from .reader import corrupt_column_name

        payload_schema = self._payload_schema()
        corrupt = ""
        if payload_schema and parse_mode(get_str(self.options, "mode")) == "PERMISSIVE":
            corrupt = corrupt_column_name(self.options)
        return message_schema(payload_schema, corrupt)

    def reader(self, schema: Any) -> DataSourceReader:
        from .reader import MessageReader

        return MessageReader(self.options, schema)

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from .writer import MessageWriter

        if overwrite:
            raise SparkOptionError("the queue's log is append-only: write with mode('append'), not overwrite.")
        return MessageWriter(self.options, schema)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        from .stream import MessageStreamReader

        return MessageStreamReader(self.options, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        from .writer import MessageStreamWriter

        if overwrite:
            raise SparkOptionError("the queue's log is append-only: a stream into a topic uses outputMode('append').")
        return MessageStreamWriter(self.options, schema)
