"""The options each use of the data source accepts: unknown or misplaced ones are refused.

Spark hands a data source every option the job set, lower-cased (option names are
case-insensitive). A misspelt or misplaced option would otherwise be a silent wrong
result -- ``startingOffsets`` given to a batch read that only knew ``startingOffset``
read the whole topic. :func:`check_options` therefore refuses any option that the use
(batch read, stream read, write) does not know, naming the valid ones, and resolves the
aliases (the names of Spark's Kafka source) to one canonical name each.
"""

from __future__ import annotations

from collections.abc import Mapping

from .options import CONNECTION_OPTIONS, SparkOptionError

#: Options Spark itself may pass along with a job's own (``load(path)``, ``save(path)``,
#: ``writeStream.option("checkpointLocation", ...)``): accepted and ignored.
SPARK_OPTIONS = ("path", "checkpointlocation", "queryname")

#: Options of every read.
_READ = (
    "topic",
    "subscribePattern",
    "payloadSchema",
    "mode",
    "columnNameOfCorruptRecord",
    "rowsPerSplit",
    "failOnDataLoss",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
)

#: Canonical option names (as documented) of each use.
BATCH_READ = (
    *_READ,
    "startingOffsets",
    "endingOffsets",
    "startingOffset",
    "endingOffset",
    "startTime",
    "endTime",
    "partitions",
    "sequence",
)
STREAM_READ = (
    *_READ,
    "startingOffsets",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "group",
)
WRITE = ("topic", "idColumn", "idMode", "keyColumn", "payloadColumn", "metadataColumn", "batchSize", "idPrefix")

#: Other names of an option: ``alias -> canonical``.
ALIASES = {
    "topics": "topic",
    "subscribe": "topic",
    "maxRecordsPerTrigger": "maxOffsetsPerTrigger",
    "consumerGroup": "group",
}

USES = {"batch read": BATCH_READ, "stream read": STREAM_READ, "write": WRITE}


def _lower(names: tuple[str, ...]) -> dict[str, str]:
    return {name.lower(): name for name in names}


def check_options(options: Mapping[str, str], use: str) -> dict[str, str]:
    """Return ``options`` with aliases replaced by canonical names (lower-cased keys, as Spark's).

    Raise :class:`SparkOptionError` naming an option ``use`` does not take -- with the
    uses that do take it, and the valid names -- or one given twice under two names.
    """
    valid = _lower(USES[use])
    aliases = {alias.lower(): canonical.lower() for alias, canonical in ALIASES.items() if canonical.lower() in valid}
    resolved: dict[str, str] = {}
    given_as: dict[str, str] = {}
    for raw_name, value in options.items():
        name = raw_name.lower()
        if name in CONNECTION_OPTIONS or name in SPARK_OPTIONS:
            resolved[name] = value
            continue
        canonical = aliases.get(name, name)
        if canonical not in valid:
            raise SparkOptionError(_unknown(raw_name, use))
        if canonical in resolved and resolved[canonical] != value:
            raise SparkOptionError(
                f"sqlqueue {use}: option {given_as[canonical]!r} and {raw_name!r} are the same option "
                f"({valid[canonical]!r}) with different values; give one."
            )
        resolved[canonical] = value
        given_as[canonical] = raw_name
    return resolved


def accepted(use: str) -> set[str]:
    """Every lower-cased name ``use`` takes: its options and their aliases."""
    names = {name.lower() for name in USES[use]}
    return names | {alias.lower() for alias, canonical in ALIASES.items() if canonical.lower() in names}


def _unknown(name: str, use: str) -> str:
    lowered = name.lower()
    if lowered.startswith("kafka."):
        hint = " Kafka client options (kafka.*) have no meaning here; a stream's consumer group is option 'group'."
    else:
        elsewhere = [other for other in USES if other != use and lowered in accepted(other)]
        hint = f" It is an option of a {' or a '.join(elsewhere)} only." if elsewhere else ""
    names = sorted([*USES[use], *(a for a, c in ALIASES.items() if c in USES[use])], key=str.lower)
    return f"sqlqueue {use}: unknown option {name!r}.{hint} Valid options: {', '.join(names)} (and the connection's)."
