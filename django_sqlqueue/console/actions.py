"""Groups (offsets, seek, pause/resume, drop) and dead letters (list, detail, replay, purge)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.http.response import Http404
from django.utils.http import urlencode

from .. import ops
from ..exceptions import SQLQueueError
from . import live
from .auditing import audit_batches
from .base import (
    audit,
    confirmed,
    fail,
    flash,
    next_url,
    parse_int,
    parse_search,
    parse_time,
    pretty,
    preview,
    require,
    require_action,
    url,
)
from .pages import Pages
from .tasks import TaskPages

#: Dead letters per transaction (and per LogEntry) of a bulk replay or purge.
BATCH_SIZE = ops.deadletters.DEFAULT_BATCH


def _actor(request: HttpRequest) -> str:
    return request.user.get_username()


class Views(Pages, TaskPages):
    # -- groups -----------------------------------------------------------------------

    def groups(self, request: HttpRequest) -> HttpResponse:
        require(request)
        return self.render(
            request,
            "groups.html",
            {"groups": ops.list_groups(), "paused": ops.paused_topics()},
            tab="groups",
            title="Consumer groups",
        )

    def group(self, request: HttpRequest, group: str, topic: str) -> HttpResponse:
        require(request)
        try:
            rows = ops.group_offsets(group, topic)
        except ops.NotFound as exc:
            raise Http404(str(exc)) from exc
        # The window's history, its summary and the action log's markers (console/live.py).
        history = live.GroupHistory.load(request, group, topic)
        if live.wants_json(request):
            return live.group_json(request, rows, history)
        info = ops.list_groups(group, topic)
        return self.render(
            request,
            "group.html",
            {
                "group": group,
                "topic": topic,
                "rows": rows,
                "info": info[0] if info else None,
                "lag": sum(r.lag for r in rows),
                "atomic": ops.consumer_atomic(group, topic),
                "history": history,
                "live_url": live.live_url(request),
            },
            tab="groups",
            title=f"Group {group} on {topic}",
        )

    def seek(self, request: HttpRequest, group: str, topic: str) -> HttpResponse:
        require_action(request, "seek")
        back = url("group", group, topic)
        p = request.POST
        try:
            mode = p.get("mode", "")
            kwargs: dict = {"partitions": ops.parse_partitions(p.get("partitions") or None)}
            if mode == "offset":
                kwargs["offset"] = parse_int(p.get("value"), "offset")
                if kwargs["offset"] is None:
                    raise ops.OperationError("enter the offset to seek to.")
            elif mode == "time":
                kwargs["time"] = parse_time(p.get("value"), "time")
                if kwargs["time"] is None:
                    raise ops.OperationError("enter the time to seek to.")
            elif mode in ("earliest", "latest"):
                kwargs["position"] = mode
            else:
                raise ops.OperationError(f"unknown seek mode {mode!r}.")
            if not confirmed(request):
                plan = ops.plan_seek(group, topic, **kwargs)
                redeliver, skip = plan.shown()
                return self.confirm(
                    request,
                    tab="groups",
                    title=f"Seek {group} on {topic}?",
                    summary=(
                        f"{redeliver.capitalize()} message(s) will be delivered again and {skip} skipped "
                        f"in {len(plan.partitions)} partition(s)."
                    ),
                    details=[
                        (
                            "The partitions' leases are released in the same transaction: live workers stop writing "
                            "to them at once and a worker resumes from the new watermark within about a second."
                        ),
                    ],
                    table={
                        "head": ["partition", "head", "watermark", "new watermark", "redelivered", "skipped"],
                        "rows": [(r.partition, r.head, r.watermark, r.target, *r.shown()) for r in plan.partitions],
                    },
                    danger=plan.skip > 0,
                    back=back,
                )
            plan = ops.seek(group, topic, **kwargs)
        except SQLQueueError as exc:
            fail(request, exc)
            return HttpResponseRedirect(back)
        audit(request, f"group {group} on {topic}", plan.describe().capitalize() + ".")
        flash(request, messages.SUCCESS, plan.describe().capitalize() + ".")
        return HttpResponseRedirect(back)

    def pause(self, request: HttpRequest, group: str, topic: str) -> HttpResponse:
        action = "resume" if request.POST.get("resume") else "pause"
        require_action(request, action)
        try:
            if action == "pause":
                changed = ops.pause(group, topic, by=_actor(request), reason=request.POST.get("reason", ""))
            else:
                changed = ops.resume(group, topic)
        except SQLQueueError as exc:
            fail(request, exc)
        else:
            verb = "Paused" if action == "pause" else "Resumed"
            if changed:
                audit(request, f"group {group} on {topic}", f"{verb} {group} on {topic} (1 topic).")
                flash(request, messages.SUCCESS, f"{verb} {group} on {topic}.")
            else:
                state = "paused" if action == "pause" else "running"
                flash(request, messages.WARNING, f"{group} on {topic} was already {state}.")
        return HttpResponseRedirect(next_url(request, url("group", group, topic)))

    def drop(self, request: HttpRequest) -> HttpResponse:
        require_action(request, "drop")
        group, topic = request.POST.get("group", ""), request.POST.get("topic") or None
        force = request.POST.get("force") == "1"
        what = f"group {group}" + (f" on {topic}" if topic else "")
        try:
            if not confirmed(request):
                preview = ops.drop_group(group, topic=topic, force=force, dry_run=True)
                return self.confirm(
                    request,
                    tab="groups",
                    title=f"Drop {what}?",
                    summary=f"Delete {preview.total} row(s) of {what}: it will be forgotten and stop holding back GC.",
                    details=[f"{table}: {n}" for table, n in preview.rows.items()]
                    + ([f"It has {preview.live_subscribers} live subscriber(s)!"] if preview.live_subscribers else []),
                    back=url("groups"),
                )
            done = ops.drop_group(group, topic=topic, force=force)
        except SQLQueueError as exc:
            fail(request, exc)
            return HttpResponseRedirect(url("groups"))
        detail = ", ".join(f"{t}: {n}" for t, n in done.rows.items())
        audit(request, what, f"Dropped {what}: {done.total} row(s) ({detail}).", deletion=True)
        flash(request, messages.SUCCESS, f"Dropped {what} ({done.total} rows).")
        return HttpResponseRedirect(url("groups"))

    # -- dead letters -----------------------------------------------------------------

    @staticmethod
    def _dl_filter(data: dict) -> ops.DeadLetterFilter:
        return ops.DeadLetterFilter(
            topic=data.get("topic") or None,
            group=data.get("group") or None,
            error=data.get("error") or None,
            failed_after=parse_time(data.get("failed_after"), "failed after"),
            failed_before=parse_time(data.get("failed_before"), "failed before"),
            key=data.get("key") or None,
            id=data.get("id") or None,
            text=data.get("text") or None,
            **parse_search(data),
        ).resolved()  # a payload search's window made explicit: confirmed and acted on as shown

    def deadletters(self, request: HttpRequest) -> HttpResponse:
        require(request)
        error, page, f = None, None, ops.DeadLetterFilter()
        try:
            f = self._dl_filter(request.GET)
            if live.wants_json(request):  # the live count (console/live.py): no page read
                return live.dead_letters_json(request, f, None)
            cursor = parse_int(request.GET.get("cursor"), "cursor")
            page = ops.list_dead_letters(f, cursor=cursor, limit=50, preview=True)
        except SQLQueueError as exc:
            if live.wants_json(request):
                return live.dead_letters_json(request, f, str(exc))
            error = str(exc)
        return self.render(
            request,
            "deadletters.html",
            {
                "page": page,
                "filter": request.GET,
                "qs": urlencode(f.as_query()),
                # The action form's filter: the one listed (a payload search's window made explicit).
                "hidden": f.as_query().items(),
                "searched": f if f.field else None,
                "error": error,
                "topics": sorted({t.topic for t in ops.list_topics() if not t.dead_letter_topic}),
                **(live.dead_letters_context(request, f, page) if page else {}),
            },
            tab="deadletters",
            title="Dead letters",
        )

    def deadletter(self, request: HttpRequest, seq: str) -> HttpResponse:
        require(request)
        try:
            d = ops.get_dead_letter(int(seq))
        except (ops.NotFound, ValueError) as exc:
            raise Http404(str(exc)) from exc
        return self.render(
            request,
            "deadletter.html",
            {"d": d, "payload": pretty(d.payload), "metadata": pretty(d.metadata), "size": preview(d.payload).size},
            tab="deadletters",
            title=f"Dead letter {d.id}",
        )

    def deadletter_action(self, request: HttpRequest) -> HttpResponse:
        p = request.POST
        action = p.get("action", "")
        if request.method != "POST" or action not in ("replay", "purge"):
            require_action(request, "replay" if action != "purge" else "purge")
            flash(request, messages.ERROR, f"unknown action {action!r}.")
            return HttpResponseRedirect(url("deadletters"))
        require_action(request, action)
        scope = p.get("scope", "selected")
        back = next_url(request, url("deadletters"))
        try:
            f = self._dl_filter(p)
            if scope == "matching":
                count = ops.count_dead_letters(f)
                what = f"every dead letter matching: {f.describe()}"
                seqs = None
            else:
                seqs = p.getlist("seq")
                if not seqs:
                    raise ops.OperationError("select at least one dead letter.")
                count = len(seqs)
                what = f"{count} selected dead letter(s)"
            single_replay = action == "replay" and scope != "matching" and len(seqs or []) == 1
            if not confirmed(request) and not single_replay:
                verb = "Replay" if action == "replay" else "Purge"
                return self.confirm(
                    request,
                    tab="deadletters",
                    title=f"{verb} dead letters?",
                    summary=f"{verb} {count} dead letter(s): {what}.",
                    details=[
                        "Each is delivered again to the consumer group that failed it, and only to that group; "
                        "it leaves the dead-letter list."
                        if action == "replay"
                        else "They are deleted for good.",
                        f"Processed in batches of {BATCH_SIZE}, one transaction each (each audited in it).",
                    ],
                    danger=action == "purge",
                    back=back,
                )
            target = f"dead letters ({'seq ' + ', '.join(seqs[:20]) if seqs else f.describe()})"
            # Each batch writes its LogEntry in its own transaction (console/auditing.py).
            on_batch = audit_batches(request, target, lambda r: r.describe().capitalize(), deletion=action == "purge")
            actor = _actor(request)
            run = {"replay": (ops.replay, ops.replay_matching), "purge": (ops.purge, ops.purge_matching)}[action]
            if seqs is not None:
                result = run[0](seqs, actor=actor, batch_size=BATCH_SIZE, on_batch=on_batch)
            else:
                result = run[1](f, actor=actor, batch_size=BATCH_SIZE, on_batch=on_batch)
        except SQLQueueError as exc:
            fail(request, exc)
            return HttpResponseRedirect(back)
        flash(request, messages.SUCCESS if result.done else messages.WARNING, result.describe().capitalize() + ".")
        return HttpResponseRedirect(back)
