"""Capturing the messages a block of code publishes, and asserting on them.

:func:`capture_published` records what ``publish()`` and ``publish_many()`` store while
it is open, **commit-aware** like Django's ``captureOnCommitCallbacks(execute=True)``:

- a publish whose transaction committed is recorded (through the ``message_published``
  signal, which is sent on commit);
- a publish inside a transaction that is still open -- the test's own, under Django's
  ``TestCase`` or pytest-django's ``db`` fixture, which never commits -- is recorded as
  long as no enclosing ``atomic()`` block rolled it back: it is read from the publish's
  pending ``on_commit`` callback, which Django drops when a savepoint rolls back;
- a rolled-back publish is not recorded, nor a re-publish of an id that stored nothing,
  nor a dead-letter copy.

How: while a capture is open a receiver is connected to ``message_published`` (so every
publish registers its on-commit callback: one list append per publishing transaction);
nothing else is patched, and nothing is done at import time. Publishes of every thread
and every database alias are recorded. Payloads and metadata are what a handler will get
(decoded from the stored JSON: a ``Decimal`` is a string).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections

from .. import publisher, signals
from ..exceptions import TestingError
from ..publisher import PublishedMessage

#: What ``payload=`` of the assertions accepts: a dict (a subset the payload must contain),
#: a callable (a predicate on the payload) or any other value (compared with ``==``).
PayloadMatcher = Any

#: "Anything": the default of ``key=`` and ``payload=``.
ANY: Any = type("_Any", (), {"__repr__": lambda self: "ANY"})()

_ids = itertools.count(1)


@dataclass(frozen=True)
class CapturedMessage:
    """A message a capture recorded: where it went, and what a handler will receive."""

    topic: str
    key: str
    partition: int
    id: str
    payload: Any
    metadata: dict[str, Any]

    def describe(self) -> str:
        """One line naming the message (used in assertion failures)."""
        payload = json.dumps(self.payload, sort_keys=True, default=str)
        if len(payload) > 200:
            payload = payload[:197] + "..."
        return f"{self.topic} key={self.key!r} id={self.id!r} payload={payload}"


@dataclass
class PublishedMessages:
    """The messages published while a :func:`capture_published` block is (or was) open.

    Iterable and sized like a list, in publish order (committed ones first, then those of
    a still-open transaction). While the block is open, the list is live.
    """

    _recorded: list[CapturedMessage] = field(default_factory=list)
    _start: dict[str, int] = field(default_factory=dict)
    _frozen: list[CapturedMessage] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- reading -------------------------------------------------------------------------

    @property
    def messages(self) -> list[CapturedMessage]:
        """Every message recorded so far (see the module docstring)."""
        if self._frozen is not None:
            return list(self._frozen)
        with self._lock:
            recorded = list(self._recorded)
        # A pending callback that was run already (``captureOnCommitCallbacks(execute=True)``
        # runs them and leaves them in the list) was recorded: (topic, id) is unique.
        seen = {(m.topic, m.id) for m in recorded}
        return recorded + [m for m in self._pending() if (m.topic, m.id) not in seen]

    def __iter__(self) -> Iterator[CapturedMessage]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: int) -> CapturedMessage:
        return self.messages[index]

    def filter(
        self, topic: str | None = None, *, key: Any = ANY, payload: PayloadMatcher = ANY
    ) -> list[CapturedMessage]:
        """The recorded messages of ``topic`` (None: any) whose key and payload match."""
        return [m for m in self.messages if _matches(m, topic, key, payload)]

    def clear(self) -> None:
        """Forget what was recorded so far (pending publishes of an open transaction too)."""
        with self._lock:
            self._recorded.clear()
            self._frozen = [] if self._frozen is not None else None
        self._start = _pending_counts()

    # -- assertions ----------------------------------------------------------------------

    def assert_published(
        self, topic: str, *, key: Any = ANY, payload: PayloadMatcher = ANY, count: int | None = None
    ) -> list[CapturedMessage]:
        """Assert that ``topic`` got a matching message (exactly ``count`` of them if given).

        ``key``: compared as a string (keys are stored as strings). ``payload``: a dict is a
        subset the payload must contain (nested dicts too), a callable a predicate, any
        other value is compared with ``==``. Return the matching messages. The
        ``AssertionError`` lists what was published.
        """
        found = self.filter(topic, key=key, payload=payload)
        if (count is None and not found) or (count is not None and len(found) != count):
            wanted = "at least one message" if count is None else f"{count} message(s)"
            raise AssertionError(
                f"expected {wanted} on {topic!r}{_criteria(key, payload)}, found {len(found)}.\n{self._listing()}"
            )
        return found

    def assert_not_published(self, topic: str | None = None, *, key: Any = ANY, payload: PayloadMatcher = ANY) -> None:
        """Assert that no matching message was published (``topic`` None: no message at all)."""
        found = self.filter(topic, key=key, payload=payload)
        if found:
            where = "any topic" if topic is None else repr(topic)
            listed = "\n".join(f"  {m.describe()}" for m in found)
            raise AssertionError(
                f"expected no message on {where}{_criteria(key, payload)}, found {len(found)}:\n{listed}\n"
                f"{self._listing()}"
            )

    def _listing(self) -> str:
        messages = self.messages
        if not messages:
            return "Nothing was published inside the capture."
        lines = [f"  {m.describe()}" for m in messages[:50]]
        if len(messages) > 50:
            lines.append(f"  ... and {len(messages) - 50} more")
        return f"Published ({len(messages)}):\n" + "\n".join(lines)

    # -- recording -----------------------------------------------------------------------

    def _receive(self, sender: Any, *, message: PublishedMessage, payload: Any = None, **kwargs: Any) -> None:
        captured = CapturedMessage(
            message.topic, message.key, message.partition, message.id, payload, kwargs.get("metadata") or {}
        )
        with self._lock:
            self._recorded.append(captured)

    def _pending(self) -> list[CapturedMessage]:
        """Publishes waiting for the commit of a transaction still open, registered since the start."""
        found: list[CapturedMessage] = []
        for alias in settings.DATABASES:
            connection = connections[alias]
            if not connection.in_atomic_block:
                continue
            pending: list[Any] = connection.run_on_commit[self._start.get(alias, 0) :]
            for entry in pending:  # (savepoint ids, callback, robust)
                callback = entry[1]
                if getattr(callback, "func", None) is publisher.send_published:
                    for message, payload_json, metadata_json in callback.args[0]:
                        found.append(
                            CapturedMessage(
                                message.topic,
                                message.key,
                                message.partition,
                                message.id,
                                json.loads(payload_json),
                                json.loads(metadata_json),
                            )
                        )
        return found

    def _freeze(self) -> None:
        self._frozen = self.messages


def _pending_counts() -> dict[str, int]:
    """Where each alias's on-commit list stands: what a capture opened now must not count."""
    counts = {}
    for alias in settings.DATABASES:
        connection = connections[alias]
        # Outside a transaction the list is empty and is emptied again at each commit.
        counts[alias] = len(connection.run_on_commit) if connection.in_atomic_block else 0
    return counts


@contextmanager
def capture_published() -> Iterator[PublishedMessages]:
    """Record the messages published inside the block; yield them (see the module docstring)::

        with capture_published() as published:
            client.post("/orders/", {"customer": "alice", "total": "12.50"})
        published.assert_published("orders.created", key="alice", payload={"total": "12.50"})

    Captures nest; each records what was published while it was open. After the block the
    list no longer changes, and the module-level assertions no longer see it: assert on the
    object the block yielded (``published.assert_published(...)``), or inside the block.
    """
    captured = PublishedMessages(_start=_pending_counts())
    uid = f"django_sqlqueue.testing.capture:{next(_ids)}"
    signals.message_published.connect(captured._receive, weak=False, dispatch_uid=uid)
    _open.append(captured)
    try:
        yield captured
    finally:
        signals.message_published.disconnect(dispatch_uid=uid)
        captured._freeze()
        _open.remove(captured)


def _matches(m: CapturedMessage, topic: str | None, key: Any, payload: PayloadMatcher) -> bool:
    if topic is not None and m.topic != topic:
        return False
    if key is not ANY and m.key != str(key):
        return False
    return payload is ANY or payload_matches(m.payload, payload)


def payload_matches(actual: Any, expected: PayloadMatcher) -> bool:
    """Whether ``actual`` matches ``expected``: a dict is a (recursive) subset, a callable a
    predicate, anything else compared with ``==``."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            name in actual and payload_matches(actual[name], value) for name, value in expected.items()
        )
    if callable(expected):
        return bool(expected(actual))
    return bool(actual == expected)


def _criteria(key: Any, payload: PayloadMatcher) -> str:
    parts = []
    if key is not ANY:
        parts.append(f"key={str(key)!r}")
    if payload is not ANY:
        shown = getattr(payload, "__qualname__", None) if callable(payload) else None
        parts.append(f"payload matching {shown}()" if shown else f"payload containing {payload!r}")
    return (" with " + " and ".join(parts)) if parts else ""


#: Open captures, innermost last: what the module-level assertions look at. A closed capture
#: is never looked at again: it may belong to an earlier test (whoever holds it still can).
_open: list[PublishedMessages] = []


def current_capture(caller: str = "assert_published", after: str | None = None) -> PublishedMessages:
    """The innermost open capture; ``TestingError`` when none is open, naming ``caller`` and
    ``after`` (how to assert on a capture after its block; default ``published.<caller>(...)``)."""
    if _open:
        return _open[-1]
    raise TestingError(
        f"{caller}() needs an open capture, and none is open. Open one in this test: "
        f"`with capture_published() as published:` (then assert inside the block, or call "
        f"{after or f'published.{caller}(...)'} after it), the `sqlqueue_published` pytest fixture (open "
        "for the whole test), or SQLQueueTestMixin in a TestCase (open for each test). A capture closed "
        "earlier is never used: it may belong to an earlier test."
    )


def assert_published(
    topic: str, *, key: Any = ANY, payload: PayloadMatcher = ANY, count: int | None = None
) -> list[CapturedMessage]:
    """:meth:`PublishedMessages.assert_published` on the innermost open capture
    (``TestingError`` when no capture is open)."""
    return current_capture("assert_published").assert_published(topic, key=key, payload=payload, count=count)


def assert_not_published(topic: str | None = None, *, key: Any = ANY, payload: PayloadMatcher = ANY) -> None:
    """:meth:`PublishedMessages.assert_not_published` on the innermost open capture
    (``TestingError`` when no capture is open)."""
    current_capture("assert_not_published").assert_not_published(topic, key=key, payload=payload)
