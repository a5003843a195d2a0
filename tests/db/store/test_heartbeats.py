"""HeartbeatStore (``store/heartbeats.py``): subscriber liveness, against real rows and the
database clock."""

from __future__ import annotations

import pytest

from django_sqlqueue.db.store.heartbeats import HeartbeatStore
from django_sqlqueue.models import SubscriberHeartbeat

from ...support.engine_helpers import execute, now_minus
from .helpers import G, T

pytestmark = pytest.mark.django_db(transaction=True)


def test_heartbeat_deregister_and_active_subscribers():
    s = HeartbeatStore("default")  # the module's store on its own
    s.heartbeat(G, T, "w1")
    s.heartbeat(G, T, "w2")
    s.heartbeat("other", T, "w3")
    assert s.active_subscribers(G, T, 30) == 2
    assert s.active_subscriber_names(G, T, 30) == ["w1", "w2"]
    s.deregister(G, T, "w2")
    assert SubscriberHeartbeat.objects.get(subscriber_name="w2").deregistered_at is not None
    assert s.active_subscribers(G, T, 30) == 1
    s.heartbeat(G, T, "w2")  # back again: no longer deregistered
    assert SubscriberHeartbeat.objects.get(subscriber_name="w2").deregistered_at is None
    ago, ago_params = now_minus(60)
    sql = f"UPDATE queue_subscriber_heartbeats SET heartbeat_at = {ago} WHERE subscriber_name = 'w1'"
    assert execute(sql, ago_params) == 1
    assert s.active_subscribers(G, T, 30) == 1
    assert s.active_subscriber_names(G, T, 30) == ["w2"]
    assert s.forget_subscribers(T, 45) == 1
    assert set(SubscriberHeartbeat.objects.values_list("subscriber_name", flat=True)) == {"w2", "w3"}
