"""The Django view of the queue gauges: mount it in the project's URLconf::

    from django_sqlqueue.metrics.views import metrics

    urlpatterns = [..., path("sqlqueue/metrics", metrics)]

Access: ``Authorization: Bearer <SQLQUEUE["METRICS_TOKEN"]>`` (the scheme in any case), or
a logged-in active staff user with the console's permission ``django_sqlqueue.view_queue``
(the admin's session). Anything else gets 403; a method other than GET gets 405 (the view
is exempt from CSRF: it only reads, and refuses every unsafe method before anything else).
The response is cached in the process for
:data:`CACHE_SECONDS`: concurrent and repeated scrapes within that window cost one read
of the databases (scrapers of several replicas each read once per window). Every database
of the queue is read, its series labelled ``database``; one that cannot be read is
reported by ``sqlqueue_database_up`` 0 and the others are still served (gauges.py).
Without the ``prometheus`` extra the view answers 404 with the install hint.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Sequence

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, HttpResponseNotFound
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from django_sqlqueue.conf import get_settings

from . import INSTALL_HINT

#: Seconds a rendered scrape is served again without reading the database.
CACHE_SECONDS = 5.0

_lock = threading.Lock()
_cached: dict[tuple[str, ...] | None, tuple[float, bytes, str]] = {}


def clear_cache() -> None:
    """Forget the cached scrape (tests, or after changing the database under a running process)."""
    with _lock:
        _cached.clear()


#: The console's permission (``console/base.py``): who may not see the console's pages may
#: not read its numbers either. Not imported from there: the console needs the admin app,
#: the metrics view does not.
PERMISSION = "django_sqlqueue.view_queue"


def _bearer(header: str) -> str | None:
    """The credentials of an ``Authorization: Bearer <token>`` header, else None.

    The scheme is case-insensitive (RFC 9110, 11.1): ``bearer`` and ``BEARER`` are Bearer.
    """
    scheme, _, credentials = header.partition(" ")
    return credentials.strip(" \t") if scheme.lower() == "bearer" else None


def _allowed(request: HttpRequest) -> bool:
    token = get_settings().METRICS_TOKEN
    credentials = _bearer(request.headers.get("Authorization", ""))
    if token and credentials is not None:
        # A Bearer header is the scraper's answer: a wrong one does not fall back to the
        # session. WSGI hands headers over as Latin-1 text; check E012 keeps the token
        # printable ASCII, so any other character can only be a mismatch.
        if not credentials.isascii():
            return False
        return hmac.compare_digest(credentials.encode("ascii"), token.encode())
    user = getattr(request, "user", None)
    return bool(
        user is not None and user.is_authenticated and user.is_active and user.is_staff and user.has_perm(PERMISSION)
    )


def scrape(aliases: Sequence[str] | None = None) -> tuple[bytes, str]:
    """Return the exposition of every database of the queue (or of ``aliases``) and its content
    type, from the cache when it is younger than CACHE_SECONDS."""
    from .gauges import read_snapshots, render

    key = None if aliases is None else tuple(aliases)
    with _lock:  # one reader at a time: the others wait and get its result
        hit = _cached.get(key)
        now = time.monotonic()
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1], hit[2]
        body, content_type = render(read_snapshots(aliases))
        _cached[key] = (time.monotonic(), body, content_type)
        return body, content_type


@csrf_exempt  # so a POST gets require_GET's 405 (with Allow: GET), not the CSRF middleware's 403
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the queue gauges in Prometheus' text format (token, or staff with ``view_queue``)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return HttpResponseNotFound(
            f"sqlqueue metrics need the prometheus-client package: {INSTALL_HINT}", content_type="text/plain"
        )
    if not _allowed(request):
        return HttpResponseForbidden(
            "sqlqueue metrics: send Authorization: Bearer <METRICS_TOKEN>, or log in as staff with the permission "
            f"{PERMISSION}.",
            content_type="text/plain",
        )
    body, content_type = scrape()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
