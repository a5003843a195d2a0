"""Hypothesis strategies for the property tests: good and bad topics, keys, ids, payloads, times.

Each ``valid_*`` strategy draws only what the queue must accept and give back unchanged;
each ``any_*`` strategy draws anything a caller might pass by mistake as well (the queue
must then accept it or refuse it with a ``SQLQueueError`` naming the field).
"""

from __future__ import annotations

import datetime as dt
import json
import string
from typing import Any

from hypothesis import strategies as st

from django_sqlqueue.rules.limits import KEY_LENGTH, MAX_JSON_DEPTH, MAX_MESSAGE_ID_LENGTH, MAX_TOPIC_LENGTH

TOPIC_ALPHABET = string.ascii_letters + string.digits + "._-"

#: Characters a JSON string may hold and every database stores: any code point but the
#: lone surrogates (not text; UTF-8 cannot encode them) and NUL (PostgreSQL's jsonb has no
#: place for it), astral-plane characters included.
json_text_chars = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
#: Keys and ids: no control characters (C0 and DEL), as validation demands.
key_chars = st.characters(exclude_categories=("Cs",), exclude_characters="".join(map(chr, [*range(32), 127])))

#: Strings that tend to break things: NUL, controls, lone surrogates, astral characters,
#: padding, SQL and percent-encoding noise, combining marks, right-to-left text.
NASTY = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\n",
    "orders\n",
    "\t",
    "\x7f",
    "\ud800",
    "a\udfffb",
    "\U0001f600",
    "\U0010ffff",
    "e\u0301",
    "\u202eabc",
    "\u3000",
    "\ufeff",
    "'; DROP TABLE queue_messages; --",
    "%",
    "%zz",
    "%00",
    "%ff%fe",
    "\\u0000",
    "null",
    "NaN",
    "-1",
    "9" * 40,
    "x" * (MAX_TOPIC_LENGTH + 1),
]


def topics() -> st.SearchStrategy[str]:
    """A valid topic: 1..128 characters of [A-Za-z0-9._-]."""
    return st.text(TOPIC_ALPHABET, min_size=1, max_size=MAX_TOPIC_LENGTH)


def nasty_text(max_size: int = 300) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NASTY), st.text(max_size=max_size), st.text(json_text_chars, max_size=max_size))


def any_topic() -> st.SearchStrategy[Any]:
    return st.one_of(topics(), nasty_text(), st.text(TOPIC_ALPHABET, min_size=120, max_size=140), wild_scalars())


def key_text(max_size: int, min_size: int) -> st.SearchStrategy[str]:
    return st.text(key_chars, min_size=min_size, max_size=max_size).filter(lambda s: s == s.strip())


def valid_keys() -> st.SearchStrategy[Any]:
    """An ordering key: "" or text without controls or padding; ints and UUIDs as text."""
    return st.one_of(
        key_text(KEY_LENGTH, 0),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.uuids(),
        st.text(key_chars, min_size=KEY_LENGTH, max_size=KEY_LENGTH).filter(lambda s: s == s.strip()),
    )


def valid_ids() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), key_text(MAX_MESSAGE_ID_LENGTH, 1), st.integers(min_value=-(10**40), max_value=10**40), st.uuids()
    )


def wild_scalars() -> st.SearchStrategy[Any]:
    """Values of the wrong type (or a right type out of range) for any field."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=10**120, max_value=10**130),
        st.floats(),
        st.binary(max_size=20),
        st.sampled_from([object(), {1, 2}, frozenset(), (), [], {}, b"", bytearray(b"x"), Ellipsis, type]),
        st.datetimes(),
        st.dates(),
        st.decimals(),
        st.uuids(),
        st.timedeltas(),
    )


def any_key() -> st.SearchStrategy[Any]:
    return st.one_of(
        valid_keys(), nasty_text(), st.text(min_size=KEY_LENGTH - 2, max_size=KEY_LENGTH + 2), wild_scalars()
    )


def any_id() -> st.SearchStrategy[Any]:
    return st.one_of(valid_ids(), nasty_text(), st.text(min_size=126, max_size=130), wild_scalars())


# -- JSON -----------------------------------------------------------------------------------


def json_floats() -> st.SearchStrategy[float]:
    return st.floats(allow_nan=False, allow_infinity=False)


def json_scalars(text: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[Any]:
    text = text if text is not None else st.text(json_text_chars, max_size=40)
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63),
        st.integers(min_value=-(10**40), max_value=10**40),
        json_floats(),
        text,
    )


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Plain JSON: the values that must come back exactly (dict keys are str, no tuples)."""
    return st.recursive(
        json_scalars(),
        lambda children: st.one_of(
            st.lists(children, max_size=5),
            st.dictionaries(st.text(json_text_chars, max_size=20), children, max_size=5),
        ),
        max_leaves=max_leaves,
    )


def valid_metadata() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.dictionaries(st.text(json_text_chars, max_size=20), json_values(10), max_size=4))


def not_json() -> st.SearchStrategy[Any]:
    """Values JSON cannot carry, alone or inside a structure."""
    bad = st.one_of(
        st.sampled_from([float("nan"), float("inf"), float("-inf"), object(), {1, 2}, frozenset({1}), b"bytes", type]),
        st.sampled_from(["\x00", "a\x00", "\ud800", "x\udc80y"]),
        st.complex_numbers(),
    )
    return st.one_of(
        bad,
        st.lists(bad, min_size=1, max_size=3),
        st.dictionaries(st.text(max_size=5), bad, min_size=1, max_size=2),
        st.dictionaries(st.sampled_from([(1, 2), frozenset(), b"k"]), st.integers(), min_size=1, max_size=1),
        st.dictionaries(st.sampled_from(["\x00", "\ud800"]), st.integers(), min_size=1, max_size=1),
    )


def converted_json() -> st.SearchStrategy[Any]:
    """Values the encoder turns into JSON with a documented conversion (compared after it)."""
    return st.recursive(
        st.one_of(
            json_scalars(),
            st.decimals(allow_nan=False, allow_infinity=False),
            st.datetimes(timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=-5))])),
            st.dates(),
            st.times(),
            st.timedeltas(),
            st.uuids(),
        ),
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(st.one_of(st.text(json_text_chars, max_size=8), st.integers()), children, max_size=4),
        ),
        max_leaves=15,
    )


class _Shown:
    """Print as ``nested(depth, kind)``: Hypothesis' printer recurses and would overflow."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"nested({self.depth!r}, {type(self).__name__.removeprefix('Nested').lower()!r})")  # type: ignore[attr-defined]


class NestedList(_Shown, list):  # type: ignore[type-arg]
    pass


class NestedDict(_Shown, dict):  # type: ignore[type-arg]
    pass


def nested(depth: int, kind: str = "list", inner: Any = 1) -> Any:
    """``inner`` inside ``depth`` lists or dicts (plain ones, but for the outermost)."""
    for _ in range(depth - 1):
        inner = [inner] if kind == "list" else {"k": inner}
    outer = NestedList([inner]) if kind == "list" else NestedDict(k=inner)
    outer.depth = depth
    return outer


def deep_json() -> st.SearchStrategy[Any]:
    """Nesting around the deepest every database stores (31) and past Python's recursion limit."""
    depths = st.sampled_from([MAX_JSON_DEPTH - 1, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 64, 2000])
    return st.builds(nested, depths, st.sampled_from(["list", "dict"]), st.sampled_from([1, [], {}, "x"]))


def any_payload() -> st.SearchStrategy[Any]:
    return st.one_of(json_values(), converted_json(), not_json(), wild_scalars(), deep_json())


def any_metadata() -> st.SearchStrategy[Any]:
    return st.one_of(
        valid_metadata(),
        st.dictionaries(st.text(max_size=8), st.one_of(json_values(5), not_json(), deep_json()), max_size=3),
        json_values(5),
        not_json(),
        wild_scalars(),
    )


def long_payloads(limit: int) -> st.SearchStrategy[Any]:
    """Strings around ``limit`` bytes of JSON, in characters of 1 to 4 bytes of UTF-8."""

    def build(char: str, slack: int, wrap: bool) -> Any:
        n = max(0, (limit + slack - 2) // len(json.dumps(char, ensure_ascii=False)[1:-1].encode()))
        return {"s": char * n} if wrap else char * n

    return st.builds(
        build,
        st.sampled_from(["a", "é", "€", "\U0001f600", '"', "\n"]),
        st.integers(min_value=-8, max_value=8),
        st.booleans(),
    )


# -- times ----------------------------------------------------------------------------------

OFFSETS = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: dt.timezone(dt.timedelta(minutes=minutes))
)


def valid_schedule() -> st.SearchStrategy[dict[str, Any]]:
    """``delay``/``deliver_at`` keyword arguments every database stores (or none)."""
    return st.one_of(
        st.just({}),
        st.builds(lambda d: {"delay": d}, st.integers(min_value=0, max_value=10 * 365 * 86400)),
        st.builds(lambda d: {"delay": d}, st.floats(min_value=0, max_value=10 * 365 * 86400)),
        st.builds(lambda d: {"delay": d}, st.timedeltas(min_value=dt.timedelta(0), max_value=dt.timedelta(days=3650))),
        st.builds(
            lambda d: {"deliver_at": d},
            st.datetimes(min_value=dt.datetime(1970, 1, 2), max_value=dt.datetime(2200, 1, 1), timezones=OFFSETS),
        ),
    )


def any_schedule() -> st.SearchStrategy[dict[str, Any]]:
    wild_delay = st.one_of(
        wild_scalars(),
        st.floats(),
        st.timedeltas(),
        st.sampled_from([-1, -0.0, 1e300, 2**70, float("inf"), dt.timedelta.max, dt.timedelta.min, "10"]),
    )
    wild_when = st.one_of(
        wild_scalars(),
        st.datetimes(timezones=st.one_of(st.none(), OFFSETS)),
        st.sampled_from(
            [
                dt.datetime.min.replace(tzinfo=dt.UTC),
                dt.datetime.max.replace(tzinfo=dt.UTC),
                dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-5))),
                dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=5))),
                "2030-01-01",
            ]
        ),
    )
    return st.one_of(
        valid_schedule(),
        st.builds(lambda d: {"delay": d}, wild_delay),
        st.builds(lambda d: {"deliver_at": d}, wild_when),
        st.builds(lambda d, w: {"delay": d, "deliver_at": w}, wild_delay, wild_when),
    )
