"""The columns of messages read from the queue (batch and streaming)."""

from __future__ import annotations

#: (name, Spark SQL type) of every column a read returns, in order. Dead-letter columns
#: are empty (NULL, 0, "") for ordinary messages.
MESSAGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"),
    ("partition", "bigint"),
    ("offset", "bigint"),
    ("key", "string"),
    ("id", "string"),
    ("payload", "string"),
    ("metadata", "string"),
    ("created_at", "timestamp"),
    ("published_at", "timestamp"),
    ("deliver_at", "timestamp"),
    ("failed_at", "timestamp"),
    ("failure_count", "int"),
    ("last_error", "string"),
    ("original_topic", "string"),
)
COLUMN_NAMES = tuple(name for name, _ in MESSAGE_COLUMNS)


def message_schema(payload_schema: str = "", corrupt_column: str = "") -> str:
    """Return the DDL schema of a read; ``payload`` has type ``payload_schema`` when given.

    ``corrupt_column`` (``payloadSchema`` with ``mode=PERMISSIVE``) adds a string column
    last: the raw payload of a message that did not fit ``payload_schema``, else NULL.

    A DDL string, not a StructType: Spark parses it in the JVM (building a StructType from
    a DDL string in Python needs a SparkContext, which a data source's worker has not).
    """
    columns = []
    for name, type_name in MESSAGE_COLUMNS:
        if name == "payload" and payload_schema:
            type_name = payload_schema
        columns.append(f"`{name}` {type_name}")
    if corrupt_column:
        columns.append(f"`{corrupt_column}` string")
    return ", ".join(columns)
