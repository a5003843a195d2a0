"""rules/dlq.py: the dead-letter conventions -- names, ids, metadata, the replay marker and hooks.

Pure functions (no database); tests/ops/test_replay.py shows them at work in a replay.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_sqlqueue.conf import get_settings
from django_sqlqueue.rules import dlq


def test_dead_letter_topics_and_ids() -> None:
    assert dlq.dlq_topic("orders", "_dlq") == "orders_dlq"
    assert dlq.is_dlq_topic("orders_dlq", "_dlq") and not dlq.is_dlq_topic("orders", "_dlq")
    assert not dlq.is_dlq_topic("_dlq", "_dlq")  # the suffix alone is an ordinary topic
    with override_settings(SQLQUEUE={"DLQ_SUFFIX": ".dead"}):
        assert get_settings().dlq_topic("orders") == dlq.dlq_topic("orders", ".dead") == "orders.dead"
    # An original id may hold ':' itself; a group may not (the topic rules), so the first ':' splits.
    dead_id = dlq.dead_letter_id("billing", "order:7")
    assert dead_id == "billing:order:7" and dead_id.startswith(dlq.dead_letter_id_prefix("billing"))
    assert dlq.parse_dead_letter_id(dead_id) == ("billing", "order:7")


def test_a_dead_letter_keeps_the_originals_metadata_and_adds_where_it_failed() -> None:
    meta = dlq.dead_letter_metadata({"trace": "abc"}, group="billing", partition=1, offset=3, original_id="o1")
    assert meta["trace"] == "abc"
    assert dlq.dead_letter_info(meta) == {
        "consumer_group": "billing",
        "original_partition": 1,
        "original_offset": 3,
        "original_id": "o1",
    }
    assert dlq.dead_letter_metadata(None, group="g", partition=0, offset=1, original_id="x").keys() == {"dead_letter"}
    # Metadata written by another program: never an error, just no dead-letter part.
    assert dlq.dead_letter_info(None) == dlq.dead_letter_info({"dead_letter": "text"}) == {}


def replay(metadata: dict[str, Any], seq: int, *, error: str = "ValueError: bad\nTraceback ...") -> dict[str, Any]:
    info = dlq.dead_letter_info(metadata)
    return dlq.replay_metadata(
        metadata,
        group=info["consumer_group"],
        dead_letter_seq=seq,
        dead_letter_id=dlq.dead_letter_id(info["consumer_group"], info["original_id"]),
        original_id=info["original_id"],
        original_offset=info["original_offset"],
        original_partition=info["original_partition"],
        failure_count=5,
        last_error=error,
        actor="alice",
    )


def test_a_replayed_copy_is_marked_for_its_group_and_a_copy_of_a_copy_counts_the_replays() -> None:
    dead = dlq.dead_letter_metadata({"trace": "abc"}, group="billing", partition=1, offset=3, original_id="o1")
    first = replay(dead, 100, error="ValueError: " + "x" * 600 + "\nTraceback ...")
    assert "dead_letter" not in first and first["trace"] == "abc"
    marker = dlq.replay_marker(first)
    assert marker["consumer_group"] == "billing" and marker["dead_letter_seq"] == 100 and marker["replays"] == 1
    assert marker["last_error"] == ("ValueError: " + "x" * 600)[: dlq.REPLAY_ERROR_LENGTH]  # first line, cut
    assert dlq.replay_id("o1", 100) == "o1@replay100"
    # The copy failed again at another position: its dead letter is replayed in turn.
    again = dlq.dead_letter_metadata(first, group="billing", partition=0, offset=9, original_id="o1@replay100")
    second = dlq.replay_marker(replay(again, 200))
    assert (second["original_partition"], second["original_offset"], second["replays"]) == (1, 3, 2)


def test_only_the_group_a_copy_was_replayed_for_handles_it() -> None:
    copy = replay(dlq.dead_letter_metadata({}, group="billing", partition=0, offset=1, original_id="o1"), 7)
    assert dlq.replay_group(copy) == "billing"
    assert not dlq.is_for_other_group(copy, "billing") and dlq.is_for_other_group(copy, "shipping")
    for ordinary in ({}, None, {"trace": "abc"}, {dlq.REPLAY_KEY: "not a marker"}):
        assert dlq.replay_group(ordinary) is None and not dlq.is_for_other_group(ordinary, "shipping")


def test_replay_hooks_run_in_order_and_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dlq, "_replay_hooks", [])
    calls: list[tuple[str, Any, str, str]] = []

    def tag(topic: str, payload: Any, metadata: Any, original_id: str, using: str) -> Any:
        calls.append((topic, payload, original_id, using))
        return {**payload, "tagged": True}

    def count(topic: str, payload: Any, metadata: Any, original_id: str, using: str) -> Any:
        return {**payload, "seen": payload.get("seen", 0) + 1}

    assert dlq.prepare_replay_payload("orders", {"n": 1}, {}, "o1", "default") == {"n": 1}  # no hook: as given
    dlq.register_replay_hook(tag)
    dlq.register_replay_hook(count)
    dlq.register_replay_hook(tag)  # registered once
    assert dlq.prepare_replay_payload("orders", {"n": 1}, {}, "o1", "default") == {"n": 1, "tagged": True, "seen": 1}
    assert calls == [("orders", {"n": 1}, "o1", "default")]


def test_the_engines_names_are_reserved() -> None:
    """What publish() refuses (tests/rules/test_reserved_names.py): the engine's metadata keys and replay ids."""
    for key in (dlq.REPLAY_KEY, dlq.UNDECODABLE_KEY):
        assert key.startswith(dlq.RESERVED_METADATA_PREFIX) and dlq.is_reserved_metadata_key(key)
    assert not dlq.is_reserved_metadata_key(dlq.DEAD_LETTER_KEY) and not dlq.is_reserved_metadata_key(7)
    for seq in (0, 1, 2**63 - 1):
        assert dlq.REPLAY_ID_RE.search(dlq.replay_id("o1", seq))
    assert not dlq.REPLAY_ID_RE.search("o1@replay")


def test_a_displaced_dead_letter_keeps_its_group_prefix() -> None:
    dead = dlq.dead_letter_id("billing", "o1")
    displaced = dlq.displaced_dead_letter_id(dead, "0a1b2c")
    assert displaced == "billing:o1#0a1b2c" and displaced.startswith(dlq.dead_letter_id_prefix("billing"))
