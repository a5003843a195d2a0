"""The sequencer's index on PostgreSQL and SQLite: messages not numbered yet.

The sequencer reads a partition's unsequenced messages (``offset IS NULL``) in ``seq``
order. On MySQL/MariaDB the unique (topic, partition, offset) index serves that read:
NULLs sort first and InnoDB secondary index entries end with the primary key (seq).
PostgreSQL and SQLite get a partial index holding only the unsequenced rows, so it stays
small however long the log grows. (Not in ``Meta.indexes``: Django's system check
``models.W037`` would flag a conditional index on MySQL, which skips it.)
"""

from django.db import migrations

INDEX = "queue_msg_unsequenced"


def create(apps, schema_editor):
    if schema_editor.connection.vendor not in ("postgresql", "sqlite"):
        return
    qn = schema_editor.quote_name
    schema_editor.execute(
        f"CREATE INDEX {qn(INDEX)} ON {qn('queue_messages')} ({qn('topic')}, {qn('partition')}, {qn('seq')}) "
        f"WHERE {qn('offset')} IS NULL"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor not in ("postgresql", "sqlite"):
        return
    schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(INDEX)}")


class Migration(migrations.Migration):
    dependencies = [("django_sqlqueue", "0002_mysql_binary_collation")]
    operations = [migrations.RunPython(create, drop, elidable=False)]
