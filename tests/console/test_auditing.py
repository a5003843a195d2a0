"""console/auditing.py: each batch of a bulk console action is audited in its own transaction
(issue 28, F12).

Before, the ``LogEntry`` was written once, after the last batch: a request that failed or was
killed part-way left the batches it had committed unaudited. Now the ops layer calls the
console's ``on_batch`` inside each batch's transaction, after its writes. These tests stop a
run in its second batch -- by a replay copy the database cannot store, and by an exception
right after the batch's ``LogEntry`` was written -- and count: every committed batch has its
entry, and no rolled-back batch has one. Real database, transactions as in production.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from django.utils import timezone

from django_sqlqueue import ops, publish_many
from django_sqlqueue.console import actions, pages
from django_sqlqueue.console.auditing import audit_batches, same_transaction
from django_sqlqueue.models import Message
from django_sqlqueue.rules import dlq
from django_sqlqueue.rules.dlq import replay_id

from ..support.console_scene import SETTINGS, build, dead_letter

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def scene_settings():
    with override_settings(SQLQUEUE=SETTINGS):
        yield


@pytest.fixture
def operator() -> Client:
    user = User.objects.create_user("op", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_sqlqueue"))
    client = Client()
    client.force_login(user)
    return client


def u(name: str) -> str:
    return reverse(f"admin:django_sqlqueue_queueconsole_{name}")


def dead_letters(n: int) -> list[int]:
    """``n`` dead letters of billing on orders, oldest first."""
    return [dead_letter("billing", f"d{i}") for i in range(n)]


def entries() -> list[str]:
    return list(LogEntry.objects.order_by("pk").values_list("change_message", flat=True))


def test_the_log_entry_goes_to_the_queue_database():
    assert same_transaction()


@pytest.mark.parametrize("scope", ["selected", "matching"])
def test_a_bulk_replay_writes_one_log_entry_per_batch(operator, monkeypatch, scope):
    monkeypatch.setattr(actions, "BATCH_SIZE", 2)
    seqs = dead_letters(5)
    data = {"action": "replay", "scope": scope, "confirmed": "yes", "topic": "orders", "group": "billing"}
    operator.post(u("deadletter_action"), {**data, "seq": seqs} if scope == "selected" else data)
    assert ops.count_dead_letters() == 0
    logged = entries()
    assert len(logged) == 3, logged  # batches of 2, 2 and 1
    assert sorted(int(m.split("Replayed ")[1].split(" ")[0]) for m in logged) == [1, 2, 2]
    assert all(m.endswith(f"(batch {i}).") for i, m in enumerate(logged, 1))
    assert set(LogEntry.objects.values_list("action_flag", flat=True)) == {CHANGE}


def test_a_replay_that_fails_in_its_second_batch_leaves_one_log_entry_per_committed_batch(operator, monkeypatch):
    """The copy of the 3rd dead letter cannot be written (its id is taken by a row written
    around publish()): batch 2 rolls back. Batch 1 stays replayed -- and audited (before:
    no LogEntry at all)."""
    monkeypatch.setattr(actions, "BATCH_SIZE", 2)
    seqs = dead_letters(5)
    now = timezone.now()
    Message.objects.create(
        topic="orders",
        partition=1,
        key="k1",
        id=replay_id("d2", seqs[2]),
        payload={},
        deliver_at=now,
        created_at=now,
        published_at=now,
    )
    response = operator.post(u("deadletter_action"), {"action": "replay", "seq": seqs, "confirmed": "yes"}, follow=True)
    assert "this batch was rolled back" in response.content.decode()
    remaining = set(Message.objects.filter(topic="orders_dlq").values_list("seq", flat=True))
    assert remaining == set(seqs[2:])  # batch 1 (seqs 0, 1) committed; batch 2 and 3 did not run
    assert entries() == ["Replayed 2 dead letter(s) (billing: 2) (batch 1)."]


def test_a_request_that_dies_in_its_second_batch_leaves_its_first_batch_audited(operator, monkeypatch):
    """A project's replay hook raises (not a SQLQueueError: the request ends in a 500) on the
    3rd dead letter. Batch 1 committed and has its LogEntry; before, it had none (the one
    LogEntry came after the last batch, which never returned)."""
    monkeypatch.setattr(actions, "BATCH_SIZE", 2)
    seqs = dead_letters(5)

    def hook(topic: str, payload: object, metadata: object, original_id: str, using: str) -> object:
        if original_id == "d2":
            raise RuntimeError("the hook died")
        return payload

    monkeypatch.setattr(dlq, "_replay_hooks", [])  # restored after the test
    dlq.register_replay_hook(hook)
    with pytest.raises(RuntimeError, match="the hook died"):
        operator.post(u("deadletter_action"), {"action": "replay", "seq": seqs, "confirmed": "yes"})
    assert set(Message.objects.filter(topic="orders_dlq").values_list("seq", flat=True)) == set(seqs[2:])
    assert entries() == ["Replayed 2 dead letter(s) (billing: 2) (batch 1)."]


def test_a_batch_and_its_log_entry_commit_together(monkeypatch):
    """An exception raised in batch 2 right after its LogEntry was written (as if the request
    died there) rolls back the batch and its LogEntry together; batch 1 keeps both."""
    seqs = dead_letters(4)
    request = RequestFactory().post("/")
    request.user = User.objects.create_user("op", is_staff=True)
    audit = audit_batches(request, "dead letters", lambda r: r.describe().capitalize(), deletion=True)

    def dying(result: ops.BulkResult) -> None:
        audit(result)
        if LogEntry.objects.count() == 2:
            raise RuntimeError("killed in batch 2, after its LogEntry")

    with pytest.raises(RuntimeError, match="killed"):
        ops.purge(seqs, batch_size=2, on_batch=dying)
    assert sorted(Message.objects.filter(topic="orders_dlq").values_list("seq", flat=True)) == seqs[2:]
    assert entries() == ["Purged 2 dead letter(s) (billing: 2) (batch 1)."]
    assert LogEntry.objects.get().action_flag == DELETION


def test_nothing_done_nothing_logged(operator):
    (seq,) = dead_letters(1)
    data = {"action": "replay", "seq": seq}
    operator.post(u("deadletter_action"), data)
    again = operator.post(u("deadletter_action"), data, follow=True).content.decode()
    assert "were gone already" in again
    assert entries() == ["Replayed 1 dead letter(s) (billing: 1) (batch 1)."]


def test_a_topic_purge_logs_its_fence_and_each_batch_of_deletes(operator, monkeypatch):
    monkeypatch.setattr(pages, "PURGE_BATCH_SIZE", 2)
    build()  # typo: 3 messages
    publish_many("typo", [{"payload": {"n": i}} for i in range(2)])
    operator.post(u("purge_topic"), {"topic": "typo", "confirmed": "yes"})
    assert not Message.objects.filter(topic="typo").exists()
    assert entries() == [
        (
            "Purging topic typo: moved every watermark to the head, deleted 0 delivery state row(s) and 0 lease(s) "
            "(batch 1)."
        ),
        "Purged topic typo: deleted 2 message(s) (batch 2).",
        "Purged topic typo: deleted 2 message(s) (batch 3).",
        "Purged topic typo: deleted 1 message(s) (batch 4).",
    ]
    assert set(LogEntry.objects.values_list("action_flag", flat=True)) == {DELETION}
    assert set(LogEntry.objects.values_list("object_repr", flat=True)) == {"topic typo"}


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_log_entry_on_another_database_is_written_after_the_batch_commits():
    """A router that puts LogEntry on another alias: no transaction spans both, so the entry
    is written right after each batch commits (transaction.on_commit on the queue's alias)."""

    class Router:
        def db_for_write(self, model, **hints):
            return "other" if model is LogEntry else None

        def allow_relation(self, obj1, obj2, **hints):
            return True  # the aliases are the same database

    seqs = dead_letters(3)
    request = RequestFactory().post("/")
    request.user = User.objects.create_user("op", is_staff=True)
    with override_settings(DATABASE_ROUTERS=[Router()]):
        assert not same_transaction()
        seen: list[int] = []
        audit = audit_batches(request, "dead letters", lambda r: r.describe().capitalize())

        def counting(result: ops.BulkResult) -> None:
            audit(result)
            seen.append(LogEntry.objects.using("default").count())  # not yet: after the commit

        ops.purge(seqs, batch_size=2, on_batch=counting)
    assert seen == [0, 1]
    assert entries() == [
        "Purged 2 dead letter(s) (billing: 2) (batch 1).",
        "Purged 1 dead letter(s) (billing: 1) (batch 2).",
    ]
