"""On MySQL/MariaDB, compare queue keys byte for byte.

The default utf8mb4 collations are case- and accent-insensitive: message ids "A" and
"a" (or topics "Orders" and "orders") would be one in SQL and two in Python.
Converting the queue tables to ``utf8mb4_bin`` makes every key comparison exact. Other
databases compare strings exactly already, so this migration does nothing there and
leaves Django's model state unchanged.
"""

from django.db import migrations

TABLES = [
    "queue_messages",
    "queue_topics",
    "queue_partitions",
    "queue_delivery_state",
    "queue_partition_leases",
    "queue_offsets",
    "queue_subscriber_heartbeats",
    "queue_paused_topics",
]


def to_binary(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for table in TABLES:
        schema_editor.execute(
            f"ALTER TABLE {schema_editor.quote_name(table)} CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
        )


def to_default(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} CONVERT TO CHARACTER SET utf8mb4")


class Migration(migrations.Migration):
    atomic = False  # MySQL cannot run DDL inside a transaction
    dependencies = [("django_sqlqueue", "0001_initial")]
    operations = [migrations.RunPython(to_binary, to_default, elidable=False)]
