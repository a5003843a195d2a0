"""Which database alias holds a topic (``SQLQUEUE["TOPIC_DATABASES"]``).

``TOPIC_DATABASES`` maps topic patterns to aliases of ``settings.DATABASES``:
``{"orders.*": "orders", "billing": "billing"}``. A pattern is a topic name in which ``*``
stands for any run of characters (``orders.*`` holds ``orders.created`` and
``orders.eu.paid``). A topic no pattern names lives in ``SQLQUEUE["DATABASE"]``.

When several patterns name a topic, the most specific wins, whatever their order in the
dict: an exact name before any pattern, then the pattern with the most characters other
than ``*`` (ties: the longer pattern, then the one first in sort order). The choice is a
pure function of the setting, so every process of a deployment routes a topic alike.

A dead-letter topic lives where its topic lives (a dead letter moves in one transaction of
that database), so it is routed by its original topic's name, never by its own.

A leaf: the settings (``conf.py``) call :func:`route_problems` and :func:`route`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from .dlq import is_dlq_topic
from .limits import MAX_TOPIC_LENGTH

#: What a pattern may hold: the characters of a topic name, and ``*``.
PATTERN_RE = re.compile(r"^[A-Za-z0-9._*-]+$")


def route(topic: str, routes: Mapping[str, str], default: str, dlq_suffix: str) -> str:
    """Return the alias of ``topic`` under ``routes`` (``default`` when no pattern names it)."""
    if not routes:
        return default
    if is_dlq_topic(topic, dlq_suffix):
        topic = topic[: -len(dlq_suffix)]
    exact = routes.get(topic)
    if exact is not None:
        return exact
    for pattern in _ordered(tuple(routes)):
        if "*" in pattern and _regex(pattern).fullmatch(topic):
            return routes[pattern]
    return default


def aliases(routes: Mapping[str, str], default: str) -> list[str]:
    """Every alias the queue uses: ``default`` first, then the routes' in the order they appear."""
    return list(dict.fromkeys([default, *routes.values()]))


def route_problems(raw: Any, databases: Mapping[str, Any]) -> list[str]:
    """Return what is wrong with a raw ``TOPIC_DATABASES`` value (empty when it is valid)."""
    if not isinstance(raw, dict):
        return [f"SQLQUEUE['TOPIC_DATABASES'] must be a dict of topic pattern -> alias, not {type(raw).__name__}."]
    problems = []
    for pattern, alias in raw.items():
        where = f"SQLQUEUE['TOPIC_DATABASES'][{pattern!r}]"
        if not (isinstance(pattern, str) and 0 < len(pattern) <= MAX_TOPIC_LENGTH and PATTERN_RE.match(pattern)):
            problems.append(
                f"{where}: not a topic pattern (a topic name of [A-Za-z0-9._-] in which * stands for any run of "
                f"characters, at most {MAX_TOPIC_LENGTH} long)."
            )
        elif not isinstance(alias, str) or alias not in databases:
            problems.append(f"{where} is {alias!r}, which is not a key of settings.DATABASES.")
    return problems


@functools.lru_cache(maxsize=64)
def _ordered(patterns: tuple[str, ...]) -> list[str]:
    """The patterns, most specific first (see the module's docstring)."""
    return sorted(patterns, key=lambda p: (-len(p.replace("*", "")), -len(p), p))


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))
