"""QueueStore (``django_sqlqueue/db/store/``): one test module per store module, against real
rows and the database clock.

Messages are published through keys chosen for their hash (``key_for_partition``) and
sequenced before the consumer side reads them; every write of a subscriber is fenced by
its lease, so the tests lease the partitions they write (``helpers.py``).
"""
