"""The Django view of the queue gauges: mount it in the project's URLconf::

    from django_sqlqueue.metrics.views import metrics

    urlpatterns = [..., path("sqlqueue/metrics", metrics)]

Access: ``Authorization: Bearer <SQLQUEUE["METRICS_TOKEN"]>``, or a logged-in staff user
(the admin's session). Anything else gets 403. The response is cached in the process for
:data:`CACHE_SECONDS`: concurrent and repeated scrapes within that window cost one read
of the database (scrapers of several replicas each read once per window). Without the
``prometheus`` extra the view answers 404 with the install hint.
"""

from __future__ import annotations

import hmac
import threading
import time

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, HttpResponseNotFound
from django.views.decorators.http import require_GET

from django_sqlqueue.conf import get_settings

from . import INSTALL_HINT

#: Seconds a rendered scrape is served again without reading the database.
CACHE_SECONDS = 5.0

_lock = threading.Lock()
_cached: dict[str | None, tuple[float, bytes, str]] = {}


def clear_cache() -> None:
    """Forget the cached scrape (tests, or after changing the database under a running process)."""
    with _lock:
        _cached.clear()


def _allowed(request: HttpRequest) -> bool:
    token = get_settings().METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer "):
        return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_active and user.is_staff)


def scrape(using: str | None = None) -> tuple[bytes, str]:
    """Return the exposition and content type, from the cache when it is younger than CACHE_SECONDS."""
    from .gauges import read_snapshot, render

    with _lock:  # one reader at a time: the others wait and get its result
        hit = _cached.get(using)
        now = time.monotonic()
        if hit is not None and now - hit[0] < CACHE_SECONDS:
            return hit[1], hit[2]
        body, content_type = render(read_snapshot(using))
        _cached[using] = (time.monotonic(), body, content_type)
        return body, content_type


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the queue gauges in Prometheus' text format (token or staff login)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return HttpResponseNotFound(
            f"sqlqueue metrics need the prometheus-client package: {INSTALL_HINT}", content_type="text/plain"
        )
    if not _allowed(request):
        return HttpResponseForbidden("sqlqueue metrics: send Authorization: Bearer <METRICS_TOKEN> or log in as staff.")
    body, content_type = scrape()
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
