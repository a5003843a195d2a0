"""The sequencer: numbers committed messages (moved to django_sqlqueue.db.sequencer).

Kept so that the import path the documentation used before 0.1 keeps working; new code
imports ``django_sqlqueue.db.sequencer``.
"""

from .db.sequencer import *  # noqa: F403
