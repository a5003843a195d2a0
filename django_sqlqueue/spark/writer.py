"""Writes: a DataFrame (or a stream) becomes messages, through the engine's own publisher.

Every Spark task publishes its rows with ``db.store.messages.write_messages`` -- the code behind
``publish_many`` -- in transactions of ``batchSize`` rows: append-only INSERTs hashed to
partitions exactly as ``publish()`` hashes them, so parallel tasks never lock each other's
rows and cannot deadlock. Publishing is idempotent on ``(topic, id)``: a task that Spark
retries after a failure, or a job run again, stores nothing twice. That needs ids that
are the same on every run:

- an ``id`` column (``idColumn`` renames it) -- the default and the best choice;
- ``idMode=content``: the id is a hash of the topic, key and payload; identical rows
  then collapse into one message (use it for data that has no id and no duplicates);
- streaming writes without an id column: ``<prefix>:<batch id>:<task partition>:<row>``,
  which is the same when Spark replays a micro-batch from a replayable source.

Columns: ``payload`` (struct, map, array or a JSON string; ``payloadColumn`` renames
it), optional ``key`` (``keyColumn``) and ``metadata`` (struct, map or JSON string).
A row with bad data fails the task with an ``InvalidMessage`` naming the row; nothing of
that transaction is written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from .databases import choose_database
from .options import SparkOptionError, get_int, get_str, get_topics
from .optionset import check_options
from .runtime import database

DEFAULT_BATCH_SIZE = 2000


@dataclass
class PublishedCount(WriterCommitMessage):
    """What one task published: new messages and ids that were already there."""

    created: int
    existing: int


@dataclass(frozen=True)
class Columns:
    """The column name of each part of a message (None: absent)."""

    payload: str
    payload_is_text: bool
    key: str | None
    id: str | None
    metadata: str | None
    metadata_is_text: bool


def resolve_columns(schema: Any, options: Mapping[str, str], *, need_id: bool) -> tuple[Columns, str]:
    """Locate the payload/key/id/metadata columns; return them and the id mode."""
    from pyspark.sql.types import StringType

    names = [f.name for f in schema.fields]
    lowered = {name.lower(): i for i, name in enumerate(names)}

    def find(option: str, default: str, required: bool) -> int | None:
        name = get_str(options, option, default)
        index = lowered.get(name.lower())
        if index is None and required:
            raise SparkOptionError(
                f"sqlqueue write: the DataFrame has no column {name!r} (columns: {', '.join(names)})."
            )
        return index

    def name_of(index: int | None) -> str | None:
        return None if index is None else names[index]

    payload = find("payloadColumn", "payload", True)
    assert payload is not None
    id_mode = get_str(options, "idMode", "column").lower()
    if id_mode not in ("column", "content"):
        raise SparkOptionError(f"option 'idMode' must be 'column' or 'content', got {id_mode!r}.")
    id_index = find("idColumn", "id", need_id and id_mode == "column") if id_mode == "column" else None
    metadata = find("metadataColumn", "metadata", False)
    return (
        Columns(
            payload=names[payload],
            payload_is_text=isinstance(schema.fields[payload].dataType, StringType),
            key=name_of(find("keyColumn", "key", False)),
            id=name_of(id_index),
            metadata=name_of(metadata),
            metadata_is_text=metadata is not None and isinstance(schema.fields[metadata].dataType, StringType),
        ),
        id_mode,
    )


def converter(data_type: Any) -> Any:
    """Return a function turning a value of ``data_type`` as Arrow's ``to_pylist`` gives it
    into plain JSON-able Python (Arrow gives maps as lists of pairs), or None if nothing to do."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, MapType):
        inner = converter(data_type.valueType)
        if inner is None:
            return lambda v: None if v is None else dict(v)
        return lambda v: None if v is None else {k: inner(x) for k, x in v}
    if isinstance(data_type, ArrayType):
        inner = converter(data_type.elementType)
        return None if inner is None else (lambda v: None if v is None else [inner(x) for x in v])
    if isinstance(data_type, StructType):
        inners = {f.name: converter(f.dataType) for f in data_type.fields}
        inners = {k: c for k, c in inners.items() if c is not None}
        if not inners:
            return None

        def struct(v: Any) -> Any:
            if v is None:
                return None
            out = dict(v)
            for k, c in inners.items():
                out[k] = c(out[k])
            return out

        return struct
    return None


def content_id(topic: str, key: str, payload_json: str) -> str:
    """A deterministic id from the message's content (``idMode=content``)."""
    return "c:" + hashlib.sha256(f"{topic}\x00{key}\x00{payload_json}".encode()).hexdigest()[:40]


class Publisher:
    """Publishes the rows of one task (shared by the batch and the streaming writer)."""

    def __init__(self, options: Mapping[str, str], schema: Any, *, streaming: bool) -> None:
        from ..exceptions import InvalidMessage
        from ..rules.validation import validate_topic

        options = self.options = check_options(options, "write")
        topics = get_topics(options)
        if len(topics) != 1:
            raise SparkOptionError(f"sqlqueue write: give exactly one topic, got {', '.join(topics)}.")
        try:
            # The very check of publish(): a publisher's topic is at most MAX_TOPIC_LENGTH.
            self.topic = validate_topic(topics[0])
        except InvalidMessage as exc:
            raise InvalidMessage(f"sqlqueue write: {exc}") from None
        # The topic's database (its route), or option ``using`` (databases.py).
        options = self.options = choose_database(options, [self.topic], "write")
        self.columns, self.id_mode = resolve_columns(schema, options, need_id=not streaming)
        self.batch_size = get_int(options, "batchSize", DEFAULT_BATCH_SIZE, minimum=1) or DEFAULT_BATCH_SIZE
        self.id_prefix = get_str(options, "idPrefix", self.topic)
        types = {f.name: f.dataType for f in schema.fields}
        c = self.columns
        self.payload_converter = None if c.payload_is_text else converter(types[c.payload])
        self.metadata_converter = (
            converter(types[c.metadata]) if c.metadata is not None and not c.metadata_is_text else None
        )

    def publish(self, batches: Iterator[Any], row_id: Any = None) -> PublishedCount:
        """Publish Arrow record batches; ``row_id(position)`` names rows without an id (streaming).

        Rows arrive as Arrow batches and become dicts in one C++ call per batch
        (``to_pylist``): much cheaper than Spark's per-row ``Row`` objects.
        """
        created = existing = 0
        with database(self.options) as alias:
            # Django is set up now (by database()): models may be imported.
            from django.db import transaction

            from ..conf import get_settings
            from ..db.store.messages import write_messages
            from ..rules.validation import validate_publish_topic

            conf = get_settings()
            # Only the engine writes dead letters (rules/validation.validate_publish_topic).
            validate_publish_topic(self.topic, conf.DLQ_SUFFIX)
            batch = []
            for position, row in enumerate(row for record_batch in batches for row in record_batch.to_pylist()):
                batch.append(self._prepare(row, position, row_id, conf.MAX_PAYLOAD_BYTES))
                if len(batch) >= self.batch_size:
                    with transaction.atomic(using=alias):
                        done = write_messages(self.topic, batch, using=alias, conf=conf)
                    created += sum(m.created for m in done)
                    existing += sum(not m.created for m in done)
                    batch = []
            if batch:
                with transaction.atomic(using=alias):
                    done = write_messages(self.topic, batch, using=alias, conf=conf)
                created += sum(m.created for m in done)
                existing += sum(not m.created for m in done)
        return PublishedCount(created, existing)

    def _prepare(self, row: Any, position: int, row_id: Any, max_bytes: int) -> Any:
        """Validate one row with ``publish()``'s own code; errors name the row by id, key and position."""
        from ..exceptions import InvalidMessage

        c = self.columns
        raw_id = row[c.id] if c.id is not None else None
        raw_key = row[c.key] if c.key is not None else None
        named = [f"row {position} of this task"]
        if raw_id is not None:
            named.append(f"id {str(raw_id)[:200]!r}")
        if raw_key not in (None, ""):
            named.append(f"key {str(raw_key)[:200]!r}")
        where = ", ".join(named)
        try:
            return self._prepare_row(row, position, row_id, max_bytes)
        except InvalidMessage as exc:
            raise type(exc)(f"{where}: {exc}") from None

    def _prepare_row(self, row: Any, position: int, row_id: Any, max_bytes: int) -> Any:
        from ..exceptions import InvalidMessage
        from ..rules.validation import prepare_message

        c = self.columns
        payload = row[c.payload]
        if payload is None:
            raise InvalidMessage("the payload is NULL.")
        if c.payload_is_text:
            try:
                payload = json.loads(payload)
            except ValueError as exc:
                raise InvalidMessage(f"the payload column is not valid JSON: {exc}") from exc
        elif self.payload_converter is not None:
            payload = self.payload_converter(payload)
        metadata = row[c.metadata] if c.metadata is not None else None
        if metadata is not None:
            if c.metadata_is_text:
                try:
                    metadata = json.loads(metadata)
                except ValueError as exc:
                    raise InvalidMessage(f"the metadata column is not valid JSON: {exc}") from exc
            elif self.metadata_converter is not None:
                metadata = self.metadata_converter(metadata)
        key = row[c.key] if c.key is not None else ""
        key = "" if key is None else key
        message_id = row[c.id] if c.id is not None else None
        if message_id is None:
            if self.id_mode == "content":
                probe = prepare_message(payload, key=key, id="x", max_payload_bytes=max_bytes)
                message_id = content_id(self.topic, probe.key, probe.payload_json)
            elif row_id is not None:
                message_id = row_id(position)
            else:
                raise InvalidMessage("the id is NULL (give every row an id, or use idMode=content).")
        return prepare_message(payload, key=key, id=message_id, metadata=metadata, max_payload_bytes=max_bytes)


class MessageWriter(DataSourceArrowWriter):
    """Bulk publish (``df.write.format("sqlqueue")``): append only."""

    def __init__(self, options: Mapping[str, str], schema: Any) -> None:
        self.publisher = Publisher(options, schema, streaming=False)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self.publisher.publish(iterator)


class MessageStreamWriter(DataSourceStreamArrowWriter):
    """A stream into a topic, exactly once per micro-batch.

    Rows without an id get ``<idPrefix>:<batch id>:<task partition>:<position>``. The
    batch id is read from the task's ``streaming.sql.batchId`` local property, which
    Spark sets on every task of a micro-batch. A replayed micro-batch (same id, same
    input) therefore publishes the same ids, which the idempotent publish skips; and
    ``commit`` may run any number of times, since the rows are already durable.
    """

    def __init__(self, options: Mapping[str, str], schema: Any) -> None:
        self.publisher = Publisher(options, schema, streaming=True)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        if batch_id is None and self.publisher.columns.id is None and self.publisher.id_mode != "content":
            raise SparkOptionError(
                "sqlqueue stream write: Spark did not pass the micro-batch id to the task; give the rows an id "
                "column or use idMode=content."
            )
        partition_id = context.partitionId() if context else 0
        prefix = self.publisher.id_prefix

        def row_id(position: int) -> str:
            return f"{prefix}:{batch_id}:{partition_id}:{position}"

        return self.publisher.publish(iterator, row_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's transactions are committed, and replays are no-ops."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what committed stays, and the replay of the batch skips it."""
