"""The start of a JSON column, cut by the database: what list pages show of a payload.

A list page never loads a whole JSON value (a message's payload, a task's arguments): the
database sends ``LEFT(CAST(col AS text), n)`` and the value's length (and, where asked,
its size in bytes), and the row's own page loads the rest. ``ops/messages.py``,
``ops/deadletters.py``, ``ops/tasks.py`` and ``ops/waiting_tasks.py`` share this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Expression, F, TextField
from django.db.models.functions import Cast, Left, Length

from ..db.dialects.json_search import OctetLength

#: Characters of a JSON value (as stored text) a list row holds.
LIST_PREVIEW_LENGTH = 200


@dataclass(frozen=True)
class Cut:
    """The start of a JSON column, as the database cut it."""

    text: str
    #: Characters of the whole value as stored JSON text.
    length: int
    #: Bytes of the whole value as stored JSON text (None where not asked for).
    size: int | None = None

    @property
    def cut(self) -> bool:
        return self.length > len(self.text)


def cut_columns(
    column: str | Expression, name: str, *, size: bool = False, limit: int = LIST_PREVIEW_LENGTH
) -> dict[str, Any]:
    """Annotations holding the start of ``column`` (``<name>_head``) and its length (``<name>_length``).

    With ``size``, also its bytes (``<name>_size``). Pass them to ``QuerySet.annotate`` (and
    ``defer`` the column), then read them back with :func:`read_cut`.
    """
    source = F(column) if isinstance(column, str) else column
    text = Cast(source, TextField())
    out: dict[str, Any] = {f"{name}_head": Left(text, limit), f"{name}_length": Length(text)}
    if size:
        out[f"{name}_size"] = OctetLength(source)
    return out


def read_cut(row: Any, name: str, *, compact: bool = False) -> Cut:
    """The :class:`Cut` of the annotations :func:`cut_columns` put on ``row``.

    With ``compact``, the text loses the whitespace between JSON tokens (PostgreSQL's
    ``jsonb`` prints ``{"n": 5}``; the other databases keep the publisher's ``{"n":5}``), and
    a value that was not cut gets its compact length and size: the same on every database.
    """
    head = getattr(row, f"{name}_head", None) or ""
    length = getattr(row, f"{name}_length", None) or 0
    size = getattr(row, f"{name}_size", None)
    if not compact:
        return Cut(head, length, size)
    text = compact_json(head)
    if length <= len(head):  # the whole value
        return Cut(text, len(text), len(text.encode("utf-8", "surrogatepass")))
    return Cut(text, length, size)


def compact_json(text: str) -> str:
    """``text`` (JSON, or the start of it) without whitespace outside strings."""
    if not any(c in text for c in " \t\n\r"):
        return text
    out, in_string, escaped = [], False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in " \t\n\r":
            continue
        out.append(c)
    return "".join(out)
