"""Read-only pages: overview, messages, leases & subscribers, deliveries, topics (+ lease release, topic purge)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import Http404
from django.utils.http import urlencode

from .. import ops
from ..conf import get_settings
from ..exceptions import SQLQueueError
from ..ops.messages import SCAN_SPAN
from . import live
from .auditing import audit_batches
from .base import (
    PREVIEW_LENGTH,
    Console,
    audit,
    clip,
    confirmed,
    fail,
    flash,
    parse_int,
    parse_search,
    parse_time,
    pretty,
    preview,
    require,
    require_action,
    url,
)

#: Messages per transaction (and per LogEntry) of a topic purge.
PURGE_BATCH_SIZE = ops.topics.DEFAULT_PURGE_BATCH


class Pages(Console):
    def overview(self, request: HttpRequest) -> HttpResponse:
        require(request)
        # SQLQUEUE["HEALTH"]: the thresholds queue_health checks, flagged here too.
        thresholds = ops.configured_thresholds()
        data = ops.overview(cap=ops.dead_letter_cap(thresholds))
        health = ops.overview_problems(data, thresholds)
        # Each row with its live key and last hour's sparkline: one history read (console/live.py).
        rows, series = live.overview_rows(request, data, health)
        if live.wants_json(request):
            return live.overview_json(request, data, rows, series)
        return self.render(
            request,
            "overview.html",
            {"o": data, "health": health, "thresholds": thresholds, "rows": rows, "live_url": live.live_url(request)},
            tab="overview",
            title="Queue overview",
        )

    def messages(self, request: HttpRequest) -> HttpResponse:
        require(request)
        g = request.GET
        page, error = None, None
        try:
            f = ops.MessageFilter(
                topic=g.get("topic") or None,
                partition=parse_int(g.get("partition"), "partition"),
                key=g.get("key") or None,
                id=g.get("id") or None,
                after=parse_time(g.get("after"), "published after"),
                before=parse_time(g.get("before"), "published before"),
                **parse_search(g),
            ).resolved()  # a payload search's window made explicit: the "older" pages read the same
            page = ops.browse(f, cursor=parse_int(g.get("cursor"), "cursor"), limit=50, preview=True)
        except SQLQueueError as exc:
            f, error = ops.MessageFilter(), str(exc)
        query = f.as_query()
        # Payloads are cut by the database, not by CSS: 50 payloads of MAX_PAYLOAD_BYTES would
        # make a page of tens of megabytes. The message's own page has it all.
        rows = list(zip(page.items, page.previews, strict=True)) if page else []
        # Every known topic, not only those with messages now: with RETENTION 0 a topic whose
        # messages were all handled has none left, and it should stay one click away.
        topics = [t.topic for t in ops.list_topics()]
        if f.topic and f.topic not in topics:
            topics.append(f.topic)
        retention = get_settings().RETENTION
        return self.render(
            request,
            "messages.html",
            {
                "page": page,
                "rows": rows,
                "filter": g,
                "error": error,
                "qs": urlencode(query),
                "searched": f if f.field else None,
                "topics": topics,
                "preview_length": PREVIEW_LENGTH,
                "scan_span": f"{SCAN_SPAN:,}",
                "retention": retention,
                "kept": ops.topics.duration_text(retention) if retention > 0 else "",
                "gc_interval": ops.topics.duration_text(get_settings().GC_INTERVAL),
            },
            tab="messages",
            title="Messages",
        )

    def message(self, request: HttpRequest, seq: str) -> HttpResponse:
        require(request)
        try:
            m = ops.get_message(int(seq))
        except ops.NotFound as exc:
            raise Http404(str(exc)) from exc
        return self.render(
            request,
            "message.html",
            {"m": m, "payload": pretty(m.payload), "metadata": pretty(m.metadata), "size": preview(m.payload).size},
            tab="messages",
            title=f"Message {m.topic}[{m.partition}] seq {m.seq}",
        )

    def leases(self, request: HttpRequest) -> HttpResponse:
        require(request)
        group, topic = request.GET.get("group") or None, request.GET.get("topic") or None
        return self.render(
            request,
            "leases.html",
            {
                "leases": ops.list_leases(group, topic),
                "subscribers": ops.list_subscribers(group, topic),
                "filter": request.GET,
            },
            tab="leases",
            title="Leases and subscribers",
        )

    def release(self, request: HttpRequest) -> HttpResponse:
        require_action(request, "release")
        p = request.POST
        try:
            partition = parse_int(p.get("partition"), "partition")
            ops.release_lease(p.get("group", ""), p.get("topic", ""), partition or 0, holder=p.get("holder") or None)
        except SQLQueueError as exc:
            fail(request, exc)
        else:
            target = f"lease {p.get('group')}:{p.get('topic')}[{partition}]"
            audit(request, target, f"Released {target} held by {p.get('holder')} (1 lease).")
            flash(
                request,
                messages.SUCCESS,
                f"Released {target}; a subscriber of the group takes it at its next lease round.",
            )
        return HttpResponseRedirect(url("leases"))

    def deliveries(self, request: HttpRequest) -> HttpResponse:
        require(request)
        g = request.GET
        error, rows = None, []
        try:
            rows = ops.list_deliveries(g.get("group") or None, g.get("topic") or None, status=g.get("status") or None)
        except SQLQueueError as exc:
            error = str(exc)
        return self.render(
            request,
            "deliveries.html",
            {
                # Up to 200 rows, each error up to MAX_ERROR_LENGTH: only its two ends are shown.
                "rows": [(r, clip(r.last_error or "")) for r in rows],
                "filter": g,
                "error": error,
                "statuses": ["in flight", "retrying", "scheduled"],
            },
            tab="deliveries",
            title="In flight and retrying",
        )

    def topics(self, request: HttpRequest) -> HttpResponse:
        require(request)
        return self.render(request, "topics.html", {"topics": ops.list_topics()}, tab="topics", title="Topics")

    def purge_topic(self, request: HttpRequest) -> HttpResponse:
        require_action(request, "purge_topic")
        topic = request.POST.get("topic", "")
        try:
            if not confirmed(request):
                preview = ops.purge_topic(topic, dry_run=True)
                return self.confirm(
                    request,
                    tab="topics",
                    title=f"Purge topic {topic}?",
                    summary=f"Delete all {preview.messages} message(s) of topic {topic}.",
                    details=[
                        (
                            "Every group's watermark moves to the head of each partition, their delivery state and "
                            "leases of the topic go; messages published from now on are kept and delivered."
                        ),
                        "This cannot be undone.",
                    ],
                    back=url("topics"),
                )
            # The fence and each batch of deletes write their LogEntry in their own transaction.
            on_batch = audit_batches(request, f"topic {topic}", _describe_purge, deletion=True)
            done = ops.purge_topic(topic, batch_size=PURGE_BATCH_SIZE, on_batch=on_batch)
        except SQLQueueError as exc:
            fail(request, exc)
            return HttpResponseRedirect(url("topics"))
        flash(
            request,
            messages.SUCCESS,
            f"Purged topic {topic}: {done.messages} message(s), "
            f"{done.delivery_states} delivery state row(s), {done.leases} lease(s).",
        )
        return HttpResponseRedirect(url("topics"))


def _describe_purge(step: ops.TopicPurge) -> str:
    """The LogEntry of one transaction of a topic purge: the fence (first), or a batch of deletes."""
    if step.messages:
        return f"Purged topic {step.topic}: deleted {step.messages} message(s)"
    return (
        f"Purging topic {step.topic}: moved every watermark to the head, deleted {step.delivery_states} "
        f"delivery state row(s) and {step.leases} lease(s)"
    )
