"""Consumers of the concurrency tests (group ``tsk-conc``; started with ``--group tsk-conc``)."""

from __future__ import annotations

import os
import time

from django_sqlqueue import consumer
from tests.support.taskapp.models import Run

CONC_TOPIC = "tsk.conc"
CONC_GROUP = "tsk-conc"
#: Simulated I/O wait of a handler (an HTTP call, say).
IO_SECONDS = 0.05


@consumer(CONC_TOPIC, group=CONC_GROUP)
def io_bound(message):  # type: ignore[no-untyped-def]
    started = time.time()
    time.sleep(IO_SECONDS)
    p = message.payload
    Run.objects.create(
        label=p["run"], key=str(message.partition), seq=p["seq"], pid=os.getpid(), started=started, finished=time.time()
    )
