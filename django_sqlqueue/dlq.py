"""Dead-letter names, ids, metadata and the replay marker (moved to django_sqlqueue.rules.dlq).

Kept so that the import path the documentation used before 0.1 keeps working; new code
imports ``django_sqlqueue.rules.dlq``.
"""

from .rules.dlq import *  # noqa: F403
