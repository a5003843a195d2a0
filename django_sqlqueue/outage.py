"""Database outages as workers report them (moved to django_sqlqueue.worker.outage).

Kept so that the import path the documentation used before 0.1 keeps working; new code
imports ``django_sqlqueue.worker.outage``.
"""

from .worker.outage import *  # noqa: F403
