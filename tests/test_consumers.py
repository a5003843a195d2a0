"""The @consumer decorator, the registry, ConsumerSpec defaults and ReceivedMessage."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_sqlqueue import ConfigurationError, publish
from django_sqlqueue.conf import get_settings
from django_sqlqueue.consumers import (
    ConsumerRegistry,
    ConsumerSpec,
    ReceivedMessage,
    consumer,
    registry,
)

from .support.engine_helpers import db_now, fetch_fresh, leased, row, sequence, store


@pytest.fixture
def registered() -> Iterator[list[tuple[str, str]]]:
    """Pairs (group, topic) to remove from the global registry after the test."""
    pairs: list[tuple[str, str]] = []
    yield pairs
    for group, topic in pairs:
        registry.unregister(group, topic)


def handler_a(message):
    pass


def handler_b(message):
    pass


@pytest.mark.parametrize(
    "topic, group, options, text",
    [
        (
            "bad topic",
            "g",
            {},
            "@consumer: topic 'bad topic' has characters outside [A-Za-z0-9._-]",
        ),
        ("", "g", {}, "@consumer: topic must not be empty"),
        (
            "t" * 129,
            "g",
            {},
            "@consumer: topic is 129 characters long; the maximum is 128",
        ),
        (None, "g", {}, "@consumer: topic must be a str, got NoneType"),
        ("t", "", {}, "@consumer: consumer group must not be empty"),
        (
            "t",
            "billing/eu",
            {},
            "@consumer: consumer group 'billing/eu' has characters outside",
        ),
        (
            "t",
            "g" * 129,
            {},
            "consumer group is 129 characters long; the maximum is 128",
        ),
        ("t", "g", {"batch_size": 0}, "batch_size must be a positive integer, got 0."),
        (
            "t",
            "g",
            {"batch_size": -3},
            "batch_size must be a positive integer, got -3.",
        ),
        (
            "t",
            "g",
            {"batch_size": 2.5},
            "batch_size must be a positive integer, got 2.5.",
        ),
        (
            "t",
            "g",
            {"batch_size": True},
            "batch_size must be a positive integer, got True.",
        ),
        (
            "t",
            "g",
            {"batch_size": "10"},
            "batch_size must be a positive integer, got '10'.",
        ),
        (
            "t",
            "g",
            {"visibility_timeout": 0},
            "visibility_timeout must be a positive number, got 0.",
        ),
        (
            "t",
            "g",
            {"visibility_timeout": -1.5},
            "visibility_timeout must be a positive number, got -1.5.",
        ),
        (
            "t",
            "g",
            {"visibility_timeout": "30"},
            "visibility_timeout must be a positive number, got '30'.",
        ),
        (
            "t",
            "g",
            {"max_attempts": 0},
            "max_attempts must be a positive integer, got 0.",
        ),
        (
            "t",
            "g",
            {"max_attempts": 1.0},
            "max_attempts must be a positive integer, got 1.0.",
        ),
    ],
)
def test_consumer_validation_errors(topic, group, options, text):
    before = registry.all()
    with pytest.raises(ConfigurationError) as info:
        consumer(topic, group=group, **options)(handler_a)
    assert text in str(info.value)
    assert registry.all() == before  # nothing registered


def test_consumer_must_decorate_a_callable():
    with pytest.raises(ConfigurationError, match="@consumer must decorate a callable, not 42"):
        consumer("t", group="g")(42)
    assert registry.select(["g"], ["t"]) == []


def test_consumer_registers_and_returns_the_function(registered):
    registered.append(("reg-g", "reg.topic"))
    decorated = consumer("reg.topic", group="reg-g", batch_size=3, visibility_timeout=0.5, max_attempts=2)(handler_a)
    assert decorated is handler_a
    (spec,) = registry.select(["reg-g"])
    assert spec == ConsumerSpec("reg.topic", "reg-g", handler_a, 3, 0.5, 2)
    assert spec.name == "reg-g:reg.topic"
    # Importing the module twice registers the same function again: harmless.
    consumer("reg.topic", group="reg-g", batch_size=3)(handler_a)
    assert len(registry.select(["reg-g"])) == 1


def test_two_handlers_for_one_group_and_topic_fail(registered):
    registered.append(("dup-g", "dup.topic"))
    consumer("dup.topic", group="dup-g")(handler_a)
    with pytest.raises(ConfigurationError) as info:
        consumer("dup.topic", group="dup-g")(handler_b)
    text = str(info.value)
    assert "consumer group 'dup-g' already has a handler for topic 'dup.topic'" in text
    assert "handler_a" in text and "handler_b" in text
    (spec,) = registry.select(["dup-g"])
    assert spec.handler is handler_a
    # Another group, or another topic, may have its own handler.
    registered += [("dup-g2", "dup.topic"), ("dup-g", "dup.other")]
    consumer("dup.topic", group="dup-g2")(handler_b)
    consumer("dup.other", group="dup-g")(handler_b)
    assert len(registry.select(["dup-g", "dup-g2"])) == 3


def test_registry_select_by_group_and_topic():
    reg = ConsumerRegistry()
    specs = [ConsumerSpec(t, g, handler_a) for g in ("billing", "analytics") for t in ("orders", "refunds")]
    for s in specs:
        reg.register(s)

    def names(found):
        return [s.name for s in found]

    assert names(reg.all()) == [
        "analytics:orders",
        "analytics:refunds",
        "billing:orders",
        "billing:refunds",
    ]
    assert names(reg.select()) == names(reg.all())
    assert names(reg.select(["billing"])) == ["billing:orders", "billing:refunds"]
    assert names(reg.select(topics=["orders"])) == [
        "analytics:orders",
        "billing:orders",
    ]
    assert names(reg.select(["billing"], ["orders"])) == ["billing:orders"]
    assert names(reg.select(["billing", "analytics"], ["refunds"])) == [
        "analytics:refunds",
        "billing:refunds",
    ]
    assert reg.select(["nobody"]) == []
    assert reg.select(topics=["nothing"]) == []
    reg.unregister("billing", "orders")
    reg.unregister("billing", "never-registered")
    assert names(reg.select(["billing"])) == ["billing:refunds"]


def test_spec_resolve_falls_back_to_sqlqueue_defaults():
    bare = ConsumerSpec("t", "g", handler_a)
    custom = ConsumerSpec("t", "g", handler_a, batch_size=1, visibility_timeout=2.5, max_attempts=9)
    with override_settings(SQLQUEUE={"BATCH_SIZE": 3, "VISIBILITY_TIMEOUT": 7, "MAX_ATTEMPTS": 4}):
        options = bare.resolve(get_settings())
        assert (
            options.batch_size,
            options.visibility_timeout,
            options.max_attempts,
        ) == (3, 7.0, 4)
        options = custom.resolve(get_settings())
        assert (
            options.batch_size,
            options.visibility_timeout,
            options.max_attempts,
        ) == (1, 2.5, 9)
    with override_settings(SQLQUEUE={}):
        options = bare.resolve(get_settings())
        assert (
            options.batch_size,
            options.visibility_timeout,
            options.max_attempts,
        ) == (10, 30.0, 5)


@pytest.mark.parametrize("seconds", [0, -1, 0.0, True, "5", None, float("nan")])
def test_extend_visibility_rejects_non_positive_seconds(seconds):
    message = ReceivedMessage(
        topic="t",
        key="",
        partition=0,
        offset=1,
        id="x",
        payload=None,
        metadata={},
        attempt=1,
        created_at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        deliver_at=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
        group="g",
        _store=None,
    )
    with pytest.raises(ValueError, match="extend_visibility\\(\\) takes a positive number of seconds"):
        message.extend_visibility(seconds)


def test_extend_visibility_needs_a_delivered_message():
    message = ReceivedMessage("t", "", 0, 1, "x", None, {}, 1, None, None, "g")
    with pytest.raises(RuntimeError, match="not delivered by a worker"):
        message.extend_visibility(5)


@pytest.mark.django_db(transaction=True)
def test_extend_visibility_moves_invisible_until_from_now():
    published = publish("ext", {"x": 1}, key="k")
    sequence("ext")
    s = store()
    p = published.partition
    (fetched,) = fetch_fresh("g", "ext", p)
    leased("g", "ext", p, "w1")
    assert s.mark_delivered("g", "ext", "w1", [fetched], [], [], 5) == {p}
    message = ReceivedMessage(
        "ext", "k", p, 1, fetched.id, fetched.payload, {}, 1, None, None, "g", _store=s, _subscriber="w1"
    )
    before = db_now()
    message.extend_visibility(120)
    after = db_now()
    r = row("g", "ext", p, 1)
    assert before + dt.timedelta(seconds=120) <= r.invisible_until <= after + dt.timedelta(seconds=120)
    assert r.retry_count == 0 and not r.acked


def test_retry_and_reject_exceptions():
    from django_sqlqueue import Reject, Retry, SQLQueueError

    assert Retry().delay is None and str(Retry()) == "retry requested"
    assert Retry("gateway down", delay=2).delay == 2.0
    assert Retry(delay=0).delay == 0.0
    for bad in (-1, "5", float("nan")):
        with pytest.raises(ValueError, match="Retry delay must be a number of seconds >= 0"):
            Retry(delay=bad)
    assert isinstance(Retry(), SQLQueueError) and isinstance(Reject("x"), SQLQueueError)
