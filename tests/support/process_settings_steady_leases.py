"""Process settings whose leases outlast any stall of a loaded machine (20 s, renewed every 0.5 s).

For process tests about something other than lease loss (the sequencer under open
transactions): with the 3 s leases of ``process_settings``, a SQLite worker whose renewals
wait behind producers' transactions (the single write lock) on a loaded machine can lose
its partitions, and the redelivery that follows -- correct at-least-once behaviour -- would
read as a duplicate in a test that counts deliveries exactly.
"""

from tests.support.process_settings import *  # noqa: F403
from tests.support.process_settings import SQLQUEUE as _BASE

SQLQUEUE = {**_BASE, "LEASE_DURATION": 20, "LEASE_RENEW_INTERVAL": 0.5}
