"""Live pages: the overview, a group's page and the dead letters refresh their numbers in place.

No websocket: each live page has a JSON twin, the same view with ``?format=json`` (the same
permission check, the same filters), that a small script (``live.js``, inlined by
``base.html``) polls every 5 seconds (its ``data-live-every``) while the tab is visible and
not paused.
The JSON is small: ``values`` (the text of each element marked ``data-live="key"``) and,
only when the history changed since the version the page sent back (``v``), ``html``
(re-rendered chart fragments, for the elements marked ``data-live-html="key"``). No
payload is ever sent.

This module also reads a group page's history (:class:`GroupHistory`): the window asked for,
its series, the ``summarize()`` sentence and the action log's markers.
"""

from __future__ import annotations

import datetime as dt
import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.utils.safestring import SafeString
from django.utils.timesince import timesince

from .. import ops
from ..conf import get_settings
from ..ops.deadletters import DeadLetterFilter, matching
from ..ops.history import MAX_PAIRS, WINDOWS, Series
from . import charts
from .actionlog import group_actions
from .base import parse_int

#: Dead letters counted at most by the dead letters page's live line (then "1000+").
DEAD_LETTER_COUNT_CAP = 1000
#: The window a group's page shows when none (or a bad one) is asked for.
DEFAULT_WINDOW = "1h"


def wants_json(request: HttpRequest) -> bool:
    """Whether the request is a live page's poll (``?format=json``)."""
    return request.GET.get("format") == "json"


def live_url(request: HttpRequest) -> str:
    """The JSON twin of this page: its path and query (filters, window) with ``format=json``."""
    query = request.GET.copy()
    query["format"] = "json"
    query.pop("v", None)
    return f"{request.path}?{query.urlencode()}"


def version(*parts: Any) -> str:
    """A short fingerprint of what the charts show: the page sends it back (``v``) with each poll."""
    return str(zlib.crc32(repr(parts).encode("utf-8", "surrogatepass")))


def row_key(group: str, topic: str) -> str:
    """The ``data-live`` prefix of a (group, topic) row: unambiguous whatever the names hold."""
    return json.dumps([group, topic], ensure_ascii=False)


def respond(
    request: HttpRequest, values: Mapping[str, Any], v: str, html: Callable[[], Mapping[str, SafeString]]
) -> JsonResponse:
    """The JSON of a poll: ``values`` always, the chart fragments only when ``v`` changed."""
    fragments = {} if request.GET.get("v") == v else {k: str(s) for k, s in html().items()}
    now = dt.datetime.now(dt.UTC)
    return JsonResponse(
        {"at": f"{now:%H:%M:%S} UTC", "v": v, "values": {k: str(x) for k, x in values.items()}, "html": fragments},
        headers={"Cache-Control": "no-store"},
    )


def error(message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=400, headers={"Cache-Control": "no-store"})


# -- the overview ------------------------------------------------------------------------


def overview_rows(
    request: HttpRequest, data: ops.Overview, health: Sequence[Any]
) -> tuple[list[tuple[Any, ...]], dict[tuple, Series]]:
    """Each group row with its problems, live key and sparkline; one history read for all.

    The first ``MAX_PAIRS`` rows get a sparkline (the read is bounded); the rest show none.
    A poll (:func:`wants_json`) renders none here: :func:`overview_json` does, if they changed.
    """
    draw = not wants_json(request)
    pairs = [(g.group, g.topic) for g in data.groups][:MAX_PAIRS]
    series = ops.histories(pairs, "1h") if pairs else {}
    rows = []
    for g in data.groups:
        hp = [p for p in health if (p.group, p.topic) == (g.group, g.topic)]
        s = series.get((g.group, g.topic))
        rows.append((g, hp, row_key(g.group, g.topic), charts.sparkline(s) if s and draw else ""))
    return rows, series


def _dead_letters(count: int, cap: int) -> str:
    return f"{cap}+" if count > cap else str(count)


def overview_json(request: HttpRequest, data: ops.Overview, rows: Sequence[tuple[Any, ...]], series: dict) -> Any:
    values: dict[str, Any] = {}
    for g, _problems, key, _spark in rows:
        values[f"{key}:partitions"] = g.partitions
        values[f"{key}:subscribers"] = g.live_subscribers
        values[f"{key}:lag"] = g.lag
        values[f"{key}:oldest"] = f"{timesince(g.oldest_unhandled_at, data.now)} ago" if g.oldest_unhandled_at else "–"
        values[f"{key}:in_flight"] = g.in_flight
        values[f"{key}:retrying"] = g.retrying
        values[f"{key}:dead_letters"] = _dead_letters(g.dead_letters, data.cap)
    v = version(sorted((pair, s.points[-2:]) for pair, s in series.items() if s.points))
    keys = {(g.group, g.topic): key for g, _, key, _ in rows}
    return respond(
        request, values, v, lambda: {f"spark:{keys[pair]}": charts.sparkline(s) for pair, s in series.items()}
    )


# -- a group's page ------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupHistory:
    """What a group's page shows of its history."""

    window: str
    series: Series
    summary: str
    markers: list[charts.Marker]
    #: Why the window asked for was not shown ("" when it was).
    error: str = ""

    @classmethod
    def load(cls, request: HttpRequest, group: str, topic: str) -> GroupHistory:
        """Read the window of ``?window=`` (1h when absent or unknown: ``error`` says so)."""
        window, problem = request.GET.get("window") or DEFAULT_WINDOW, ""
        if window not in WINDOWS:
            problem = f"Unknown window {window[:40]!r}: showing the last hour (choose {', '.join(WINDOWS)})."
            window = DEFAULT_WINDOW
        series = ops.group_history(group, topic, window)
        since = series.points[0].at if series.points else dt.datetime.now(dt.UTC)
        markers = [
            (m.at, f"{m.kind or 'action'} by {m.user or 'unknown'}: {m.message}")
            for m in group_actions(group, topic, since)
        ]
        summary = ops.group_summary(group, topic, hour=series if window == "1h" else None).describe()
        if get_settings().HISTORY_RETENTION <= 0:
            summary = 'The history is off (SQLQUEUE["HISTORY_RETENTION"] is 0): no minute is recorded. ' + summary
        return cls(window, series, summary, markers, problem)

    @property
    def windows(self) -> list[tuple[str, bool]]:
        return [(w, w == self.window) for w in WINDOWS]

    @property
    def charts(self) -> dict[str, SafeString]:
        return charts.group_fragments(self.series, self.markers)

    @property
    def version(self) -> str:
        return version(self.window, self.series.points[-2:], self.markers[-1:], len(self.markers))


def group_json(request: HttpRequest, rows: Sequence[Any], history: GroupHistory) -> JsonResponse:
    if history.error:
        return error(history.error)
    values: dict[str, Any] = {"lag": f"lag {sum(r.lag for r in rows)}", "summary": history.summary}
    for r in rows:
        for name in ("head", "watermark", "lag", "in_flight", "retrying"):
            values[f"p{r.partition}:{name}"] = getattr(r, name)
    return respond(request, values, history.version, lambda: history.charts)


# -- the dead letters ------------------------------------------------------------------------


def dead_letter_values(f: DeadLetterFilter, top: int | None) -> dict[str, str]:
    """How many dead letters match ``f`` (counted up to a cap), and how many are newer than ``top``."""
    qs = matching(f)
    count = qs[: DEAD_LETTER_COUNT_CAP + 1].count()
    newer = qs.filter(seq__gt=top)[: DEAD_LETTER_COUNT_CAP + 1].count() if top is not None else 0
    return {
        "dl_count": _dead_letters(count, DEAD_LETTER_COUNT_CAP),
        "dl_newer": f"{_dead_letters(newer, DEAD_LETTER_COUNT_CAP)} newer than this page: reload to list them."
        if newer
        else "",
    }


def dead_letters_json(request: HttpRequest, f: DeadLetterFilter, problem: str | None) -> JsonResponse:
    if problem:
        return error(problem)
    try:
        top = parse_int(request.GET.get("top"), "top")
    except ops.OperationError as exc:
        return error(str(exc))
    return respond(request, dead_letter_values(f, top), "", dict)


def dead_letters_context(request: HttpRequest, f: DeadLetterFilter, page: Any) -> dict[str, Any]:
    """The dead letters page's live line: its counts now, and its JSON twin (which counts the
    dead letters newer than the page's first, on the first page only)."""
    top = page.items[0].seq if page.items and not request.GET.get("cursor") else None
    url = live_url(request)
    if top is not None:
        url += f"&top={top}"
    return {"live_url": url, "dl_live": dead_letter_values(f, top)}
