"""The dialect interface: the mixins of each concern, combined.

:class:`Dialect` is what ``get_dialect()`` returns (a vendor subclass of it, one per
connection). Its parts live in their own modules, one concern each:

- ``fragments.py``: the connection, quoting and SQL fragments (clock, placeholders, row-lock
  suffixes, upsert clauses) -- the root every other part builds on;
- ``conversions.py``: datetimes, JSON and literals in and out of raw SQL;
- ``inserts.py``: the insert path of the publisher (with :class:`MessageRow`);
- ``sequencing.py``: the sequencer's statements and the per-hour counters;
- ``history.py``: the console's per-minute history (``queue_history``);
- ``sessions.py``: notifications, session settings, concurrent writers, connection limits.

Vendor subclasses (``mysql.py``, ``postgresql.py``, ``sqlite.py``) override attributes and
methods by name, whichever mixin defines them. The insert path's row, plan and
``in_list`` are re-exported here for the modules that import them from ``dialects.base``.
"""

from __future__ import annotations

from .history import History
from .inserts import InsertPlan, Inserts, MessageRow, in_list
from .sequencing import Sequencing
from .sessions import Sessions


class Dialect(History, Inserts, Sequencing, Sessions):
    """SQL for one database vendor.

    Subclasses set the SQL fragments and override methods where the vendor has a better
    statement. Times always come from the database clock (``now_sql``).
    """


__all__ = ["Dialect", "InsertPlan", "MessageRow", "in_list"]
