"""The probe (django_sqlqueue/worker/probe.py, ``QueueStore.newest_seqs``) and the short looks of the
cadence that use it, on a real database and a real worker."""

from __future__ import annotations

import time

import pytest
from django.db import transaction

from django_sqlqueue import publish
from django_sqlqueue.db.store import QueueStore
from django_sqlqueue.worker.probe import Probe
from tests.support.consumerapp.models import Handled
from tests.support.processes import wait_until

TOPIC = "proc.events"


@pytest.mark.django_db(transaction=True)
def test_newest_seqs_sees_committed_publishes_only():
    store = QueueStore("default")
    assert store.newest_seqs(["a.topic", "b.topic"]) == [None, None]
    publish("a.topic", {"n": 1})
    (a, b) = store.newest_seqs(["a.topic", "b.topic"])
    assert a is not None and b is None

    class RolledBack(Exception):
        pass

    with pytest.raises(RolledBack), transaction.atomic():
        publish("b.topic", {"n": 1})
        raise RolledBack
    assert store.newest_seqs(["a.topic", "b.topic"]) == [a, None]
    publish("b.topic", {"n": 2})
    assert store.newest_seqs(["a.topic", "b.topic"])[1] is not None


@pytest.mark.django_db(transaction=True)
def test_the_probe_names_the_topics_that_got_messages_since_its_last_look():
    probe = Probe(QueueStore("default"), ["a.topic", "b.topic"])
    assert probe.changed() is None  # no earlier reading: unknown
    assert probe.changed() == set()
    publish("b.topic", {"n": 1})
    assert probe.changed() == {"b.topic"}
    assert probe.changed() == set()
    probe.forget()
    assert probe.changed() is None


@pytest.mark.slow
def test_a_message_published_just_after_work_is_found_by_a_short_look(runconsumer):
    # 8 s intervals, no notifications: without the short looks (1, 1, 2, 4 s after the last
    # work, each a probe) the second message would wait for the full poll 8 s after the first.
    worker = runconsumer(
        "w1",
        "--group",
        "g1",
        settings="tests.support.process_settings_notify",
        env={"SQLQUEUE_TEST_POLL": "8", "SQLQUEUE_TEST_NOTIFY": "0"},
    )
    first = publish(TOPIC, {"n": 1}, key="k1")
    wait_until(lambda: Handled.objects.filter(message_id=first.id).exists(), 30, "the first message", show=worker.log)
    time.sleep(0.3)
    sent = time.monotonic()
    second = publish(TOPIC, {"n": 2}, key="k2")
    wait_until(
        lambda: Handled.objects.filter(message_id=second.id).exists(),
        6,
        "the second message found by a look",
        interval=0.05,
        show=worker.log,
    )
    assert time.monotonic() - sent < 6  # the full poll would come about 7.7 s after it was published
