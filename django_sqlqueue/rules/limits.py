"""Name rules and column widths: the leaf every other module takes them from.

It imports nothing of the package (and nothing of Django), so models, settings,
validation and the Spark options (which run before the app registry is ready) can all
use the same numbers without importing each other.

Keys are bounded so that every composite index stays under InnoDB's 3072-byte limit in
utf8mb4.
"""

from __future__ import annotations

import re

#: Longest topic a publisher may use. The column is wider so the DLQ suffix fits.
MAX_TOPIC_LENGTH = 128
#: Longest DLQ suffix; ``MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH`` is the column width.
MAX_DLQ_SUFFIX_LENGTH = 32
#: ``SQLQUEUE["DLQ_SUFFIX"]`` by default: dead letters of ``orders`` go to ``orders_dlq``.
DEFAULT_DLQ_SUFFIX = "_dlq"
#: Topics (and the DLQ suffix) are ASCII letters, digits, ``.``, ``_`` and ``-``, but not dots
#: alone: ``.`` and ``..`` are path segments, and a console link naming them is normalised
#: by every client to another page. ``\Z``, not ``$``: ``$`` also matches before a final
#: newline, and ``"orders\n"`` is no topic.
TOPIC_RE = re.compile(r"\A(?!\.+\Z)[A-Za-z0-9._-]+\Z")

#: Width of every topic column: a publisher's topic plus the DLQ suffix.
TOPIC_COLUMN_LENGTH = MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH
#: Longest ordering key.
KEY_LENGTH = 128
#: Longest id a publisher may give.
MAX_MESSAGE_ID_LENGTH = 128
#: The id column is wider than MAX_MESSAGE_ID_LENGTH: a dead letter's id is
#: ``<consumer group>:<original id>`` (see ``dlq.py``).
MESSAGE_ID_LENGTH = 300
#: Longest consumer group name.
CONSUMER_GROUP_LENGTH = 128
#: Longest subscriber (worker) name.
SUBSCRIBER_NAME_LENGTH = 255
#: Deepest nesting of arrays and objects in a payload or metadata. MariaDB's JSON_VALID (the
#: CHECK on the JSON columns there) refuses documents deeper than 32 levels, the innermost
#: value included; the other databases take more, but a message must be valid on all of them.
MAX_JSON_DEPTH = 31
#: Offsets, seqs and partitions are BIGINT columns: a number outside this range matches no row,
#: and SQLite's driver cannot even send it.
MAX_BIGINT = 2**63 - 1
#: Longest ``delay`` of a message and longest duration in ``SQLQUEUE``: 100 years, far beyond
#: any real use and well inside what every layer takes (much longer ones overflow a BIGINT of
#: microseconds, a MySQL DATETIME, ``threading.TIMEOUT_MAX``).
MAX_SECONDS = 100 * 365 * 86400
#: Largest ``batch_size`` of an operator's bulk action (dead-letter replay and purge, topic
#: purge): rows per transaction. Far beyond a useful size, and small enough that one batch's
#: ``IN`` list stays under every driver's parameter limit (SQLite's is 32766).
MAX_BATCH_SIZE = 10_000
#: Largest ``limit`` of an operator's list (a page of dead letters).
MAX_LIST_LIMIT = 10_000
