"""The `/metrics` page of a service that consumes the bus (executor, decider, audit sink, worker):
the process's default Prometheus registry, which holds what it refused at its door
(`adc_rejected_messages_total{subject,reason}`, shared/infra/rejections.py) and the process's own
series. Served on the port `metrics.<service>` names (shared/infra/config.py); none without one."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

from shared.infra.config import AdcConfig

log = logging.getLogger(__name__)


def serve_metrics(config: AdcConfig, service: str):
    """Start serving `/metrics` for `service` (e.g. `audit-sink`) in a thread of its own, if its port
    is configured; the server (stop it with `.shutdown()`), or None."""
    m = config.metrics
    port = {"executor": m.executor, "decider": m.decider, "audit-sink": m.audit_sink, "worker": m.worker}.get(service)
    if port is None:
        return None
    server, _ = start_http_server(port, addr=config.metrics.host)
    log.info("%s: serving /metrics on %s:%d", service, config.metrics.host, server.server_port)
    return server
