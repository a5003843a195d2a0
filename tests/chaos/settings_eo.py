"""Settings of the exactly-once run's processes (tests/chaos/exactly_once.py).

The chaos suite's settings (short clocks: a lease not renewed for 3 s is taken over, a
delivery not acked for 4 s is redelivered) with only the queue and tests/chaos/eoapp
installed: the chaos run's consumers would poll topics of their own, and its workers need
not run these.
"""

from tests.chaos.eoapp import EVENTS, FOLLOWUPS
from tests.chaos.settings import *  # noqa: F403
from tests.chaos.settings import SQLQUEUE

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_sqlqueue",
    "tests.chaos.eoapp",
]

SQLQUEUE = {
    **SQLQUEUE,
    "TOPICS": {EVENTS: {"partitions": 8}, **{topic: {"partitions": 4} for topic in FOLLOWUPS.values()}},
}
