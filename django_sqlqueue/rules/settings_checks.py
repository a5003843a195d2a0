"""Checks of the ``SQLQUEUE`` settings' nested values, and the limits they enforce.

A leaf (no settings, no models): ``conf.validate`` calls these and the system checks report
what they return. ``Problem`` is one finding with its stable check id (``sqlqueue.E0NN``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .limits import MAX_DLQ_SUFFIX_LENGTH, MAX_SECONDS, MAX_TOPIC_LENGTH, TOPIC_RE

#: Most partitions a hashed topic may have.
MAX_PARTITIONS = 4096

#: Keys a ``TOPICS`` entry may have.
TOPIC_OPTION_KEYS = frozenset({"partitions", "per_key"})

#: Keys of ``HEALTH`` and the kind of value each takes.
HEALTH_KEYS = {
    "MAX_LAG": "an integer >= 0",
    "MAX_LAG_SECONDS": "a number of seconds >= 0",
    "MAX_DEAD_LETTERS": "an integer >= 0",
    "REQUIRE_SUBSCRIBERS": "True or False",
}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the configuration, with a stable check id."""

    id: str
    msg: str
    hint: str = ""


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_seconds(value: Any, *, zero: bool = False) -> bool:
    """Whether ``value`` is a duration a worker can wait for: finite, positive (or 0), at most 100 years."""
    return is_number(value) and (value >= 0 if zero else value > 0) and value <= MAX_SECONDS and math.isfinite(value)


def validate_health(health: Any) -> list[Problem]:
    """Problems of ``SQLQUEUE["HEALTH"]``: thresholds by name, each None (off) or a value."""
    if not isinstance(health, dict):
        return [Problem("sqlqueue.E013", f"SQLQUEUE['HEALTH'] must be a dict, not {type(health).__name__}.")]
    problems: list[Problem] = []
    unknown = sorted(map(str, set(health) - set(HEALTH_KEYS)))
    if unknown:
        problems.append(
            Problem(
                "sqlqueue.E013",
                f"SQLQUEUE['HEALTH'] has unknown key(s): {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(HEALTH_KEYS)}.",
            )
        )
    for key, kind in HEALTH_KEYS.items():
        value = health.get(key)
        if value is None:
            continue
        if key == "REQUIRE_SUBSCRIBERS":
            ok = isinstance(value, bool)
        elif key == "MAX_LAG_SECONDS":
            ok = is_seconds(value, zero=True)
        else:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        if not ok:
            problems.append(Problem("sqlqueue.E013", f"SQLQUEUE['HEALTH'][{key!r}] must be {kind}, got {value!r}."))
    return problems


def validate_topics(topics: Any) -> list[Problem]:
    """Problems of ``SQLQUEUE["TOPICS"]``: topic name -> {"partitions": n} or {"per_key": True}."""
    if not isinstance(topics, dict):
        return [Problem("sqlqueue.E009", f"SQLQUEUE['TOPICS'] must be a dict, not {type(topics).__name__}.")]
    problems: list[Problem] = []
    for topic, options in topics.items():
        where = f"SQLQUEUE['TOPICS'][{topic!r}]"
        if not (
            isinstance(topic, str)
            and 0 < len(topic) <= MAX_TOPIC_LENGTH + MAX_DLQ_SUFFIX_LENGTH
            and TOPIC_RE.match(topic)
        ):
            problems.append(Problem("sqlqueue.E009", f"{where}: not a valid topic name ([A-Za-z0-9._-]+)."))
            continue
        if not isinstance(options, dict):
            problems.append(Problem("sqlqueue.E009", f"{where} must be a dict, not {type(options).__name__}."))
            continue
        unknown = sorted(map(str, set(options) - TOPIC_OPTION_KEYS))
        if unknown:
            problems.append(
                Problem(
                    "sqlqueue.E009",
                    f"{where} has unknown key(s): {', '.join(unknown)}.",
                    hint=f"Known keys: {', '.join(sorted(TOPIC_OPTION_KEYS))}.",
                )
            )
        partitions, per_key = options.get("partitions"), options.get("per_key", False)
        if not isinstance(per_key, bool):
            problems.append(Problem("sqlqueue.E009", f"{where}['per_key'] must be True or False, got {per_key!r}."))
        if per_key and partitions is not None:
            problems.append(
                Problem("sqlqueue.E009", f"{where}: a topic with one partition per key takes no 'partitions' count.")
            )
        if partitions is not None and not (
            isinstance(partitions, int) and not isinstance(partitions, bool) and 0 < partitions <= MAX_PARTITIONS
        ):
            problems.append(
                Problem(
                    "sqlqueue.E009",
                    f"{where}['partitions'] must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}.",
                )
            )
    return problems
