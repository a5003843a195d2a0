"""Consumers of topics in two databases, for the runconsumer processes of issue 32
(tests/processes/test_databases.py, tests/chaos/test_databases.py).

The names live here, not in ``consumers.py``: importing that module registers its consumers in
the process, and a test process (whose ``drain()`` runs every registered consumer) must not.
"""

#: The group of both consumers; the topic in SQLQUEUE["DATABASE"] and the one routed to "second".
GROUP = "routed"
FIRST, SECOND = "first.events", "second.events"
