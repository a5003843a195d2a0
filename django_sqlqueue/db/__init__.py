"""The data layer: every statement on a queue table, and the transactions around them.

- ``store/`` -- the consumer side and the operators' reads and writes, one module per
  responsibility, combined into :class:`~django_sqlqueue.db.store.QueueStore`; plus
  ``store/messages.py``, the append behind ``publish()``, dead letters and replays;
- ``dialects/`` -- what differs by database (MySQL/MariaDB, PostgreSQL, SQLite): SQL
  fragments, the insert and sequencing statements, session settings, LISTEN/NOTIFY;
- ``sequencer.py`` -- the transaction that numbers committed messages;
- ``session.py`` (engine connections' session settings), ``retry.py`` (retrying a
  statement through deadlocks and outages), ``conn.py`` (connection hygiene of threads).

It imports the tables (``models``, ``task_models``), the settings (``conf``), the rules and
the exceptions, and nothing above them: the write path, the worker and the operator layer
call it (the ``layers`` contract in ``pyproject.toml``; ``tests/test_data_layer.py`` fails
on SQL or an ORM write of a queue table anywhere else).
"""
