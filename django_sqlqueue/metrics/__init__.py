"""Prometheus metrics (the optional extra ``prometheus``, built on ``prometheus-client``).

- :mod:`.gauges`: the queue's state computed from the database at scrape time, a custom
  collector on a private registry (lag per partition, lag in seconds, unsequenced
  messages, dead letters, live subscribers, leased partitions, paused groups).
- :mod:`.views`: the Django view serving them (token or staff login, cached a few seconds).
- :mod:`.worker`: the counters and histograms of one ``runconsumer`` process, fed by the
  signals of :mod:`django_sqlqueue.signals` and served on ``runconsumer --metrics-port``.

Every metric is documented in docs/observability.md. The engine never imports this
package (import-linter contract ``integrations-optional``); this module imports nothing
of ``prometheus_client``, so it imports cleanly without the extra.
"""

from __future__ import annotations

from django_sqlqueue.exceptions import ConfigurationError

#: What to install when ``prometheus_client`` is missing.
INSTALL_HINT = "pip install 'django-sqlqueue[prometheus]'"


def require_prometheus_client() -> None:
    """Raise :class:`ConfigurationError` with the install hint when ``prometheus_client`` is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(f"Prometheus metrics need the prometheus-client package: {INSTALL_HINT}") from exc
