"""Small helpers of the Spark tests (real rows, real sequencer)."""

from __future__ import annotations

from typing import Any

from django_sqlqueue.db.sequencer import sequence
from django_sqlqueue.models import Message
from django_sqlqueue.publisher import publish_many


def publish_sequenced(topic: str, count: int, *, keys: int = 5, prefix: str = "m", start: int = 0) -> None:
    """Publish ``count`` keyed messages (``{"n": i}``) and number them."""
    publish_many(
        topic,
        [{"payload": {"n": i}, "key": f"k{i % keys}", "id": f"{prefix}{i}"} for i in range(start, start + count)],
    )
    sequence(topic)


def stored(topic: str) -> list[dict[str, Any]]:
    """The topic's messages as dicts (id, key, partition, offset, payload), by id."""
    return sorted(
        Message.objects.filter(topic=topic).values("id", "key", "partition", "offset", "payload"),
        key=lambda m: m["id"],
    )


def reader(spark: Any, options: dict[str, str], topic: str, **extra: str) -> Any:
    return spark.read.format("sqlqueue").options(**options).option("topic", topic).options(**extra).load()


def stream(spark: Any, options: dict[str, str], topic: str, **extra: str) -> Any:
    return spark.readStream.format("sqlqueue").options(**options).option("topic", topic).options(**extra).load()


def run_to_parquet(df: Any, out: Any, checkpoint: Any) -> list[dict[str, Any]]:
    """Run a streaming query into Parquet until it has read everything available; return its progress."""
    query = (
        df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint)).start()
    )
    try:
        query.processAllAvailable()
        return list(query.recentProgress)
    finally:
        query.stop()
