"""The rules every floor shares: names, limits and encodings, with no state of the queue.

Topic and id validation and JSON encoding (``validation``), column widths (``limits``),
dead-letter names, ids, metadata and the replay marker (``dlq``), the partition of a key
(``partitioning``), retry backoff (``backoff``), ISO times (``timeparse``), notification
channel names (``notify_channels``) and the ``atomic`` option (``atomic_modes``).

Leaves: they import only each other and ``django_sqlqueue.exceptions`` (the ``layers``
contract), so the console, Spark and the worker apply one rule, never copies of it.
"""
