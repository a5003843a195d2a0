"""Group ``routed`` consumes ``first.events`` (in SQLQUEUE["DATABASE"]) and ``second.events``
(routed to the alias ``second``: tests/support/process_settings_databases.py).

Each call is recorded in ``Handled`` (in the default database, whichever database the message
came from) before the handler returns; ``{"sleep": s}`` in the payload makes it take ``s`` seconds.
"""

from __future__ import annotations

import time

from django_sqlqueue import ReceivedMessage, consumer
from tests.support.consumerapp.consumers import _record
from tests.support.consumerapp.models import Handled

from . import FIRST, GROUP, SECOND


def handle(message: ReceivedMessage) -> None:
    Handled.objects.create(**_record(message))
    if isinstance(message.payload, dict) and message.payload.get("sleep"):
        time.sleep(message.payload["sleep"])


consumer(FIRST, group=GROUP)(handle)
consumer(SECOND, group=GROUP)(handle)
