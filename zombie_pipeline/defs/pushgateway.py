"""Pushing the pipeline's figures to the operators' Prometheus Pushgateway, with ``dagster-prometheus``.

Cleanups, health checks and statistics are runs that end, which Prometheus cannot scrape: each run
pushes its figures (``zombie_pipeline.observability.metrics``) to a Pushgateway that Prometheus scrapes. A push
replaces what its group held; the group is the queue database and the step that pushed (job
``zombie_pipeline``), so several queues, and the steps of one queue, never overwrite each other:

- ``find_zombies``: the brake (also when it stops the cleanup);
- ``report_cleanup`` (its group still labelled ``summarize``, :data:`STEP_GROUPS`): the audit trail's totals and the
  cleanup's own figures, after a successful cleanup;
- ``queue_health``: the queue's state after it;
- ``job_duration_statistics``: the suggested and configured T2 (and heartbeat timeout) of the current window;
- ``heartbeat_gap_tallies``: the heartbeat gaps a watcher saw, since its first watch.

The gateway comes from ``$ZOMBIE_PUSHGATEWAY_URL`` (``config.py``); unset, nothing is pushed. A
gateway that is down or slow never fails a run: the step logs a warning and its metadata says so
(``metrics_push_failed: 1``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from http.client import HTTPException
from typing import Any

import dagster as dg
from dagster_prometheus import PrometheusResource
from pydantic import Field

from zombie_pipeline import config
from zombie_pipeline.observability.metrics import Figures

#: The Pushgateway's ``job`` label of every push; the grouping key tells the queue database and the step.
PUSH_JOB = "zombie_pipeline"
QUEUE_DATABASE_LABEL = "queue_database"
STEP_LABEL = "step"
PUSH_FAILED = "metrics_push_failed"
#: The group of a step renamed since deployments began pushing: its old name, so that a push replaces the group the
#: gateway already holds rather than leaving it frozen beside a new one (its gauges would keep alerts firing).
STEP_GROUPS = {"report_cleanup": "summarize"}


class MetricsGateway(PrometheusResource):
    """The Pushgateway every run pushes its figures to (``dagster-prometheus``'s resource); no gateway, no push."""

    gateway: str = Field(
        default="",
        description=f"The Pushgateway's URL (host:port or http(s)://host:port), from ${config.PUSHGATEWAY_URL_ENV} in "
        "the deployment; empty: nothing is pushed.",
    )
    timeout: int = Field(
        default=5,
        ge=1,
        le=60,
        description="Seconds a push may take: a gateway that is down or slow never holds a run longer.",
    )

    def __init__(self, **fields: Any) -> None:
        # dagster-prometheus marks the resource beta and warns at every construction: nothing an operator can act on.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dg.BetaWarning)
            super().__init__(**fields)

    @property
    def enabled(self) -> bool:
        return bool(self.gateway)

    def push(
        self,
        context: dg.OpExecutionContext | dg.AssetExecutionContext,
        figures_of: Callable[[], Figures],
        queue_database: str,
    ) -> dict[str, Any]:
        """Push the figures (computed only when there is a gateway) to the group of this step and queue database,
        replacing what it held; returns the step's metadata about it.

        Never raises for the gateway's sake: a failure is a warning in the log and ``metrics_push_failed: 1``.
        """
        if not self.enabled:
            return {"metrics_push": f"off (${config.PUSHGATEWAY_URL_ENV} is not set)"}
        figures = figures_of()
        step = STEP_GROUPS.get(context.op_def.name, context.op_def.name)
        grouping = {QUEUE_DATABASE_LABEL: queue_database, STEP_LABEL: step}
        self.registry.register(figures)
        try:
            self.push_to_gateway(job=PUSH_JOB, grouping_key=grouping)
        except (OSError, HTTPException) as error:  # unreachable, refused, timed out, or an HTTP error of the gateway
            context.log.warning(f"metrics not pushed to the Pushgateway {self.gateway}: {error}; the run goes on")
            return {"metrics_push": f"failed: {error}", PUSH_FAILED: 1}
        finally:
            self.registry.unregister(figures)
        return {"metrics_push": f"{len(figures.metrics)} metrics pushed to {self.gateway} ({step})", PUSH_FAILED: 0}


def metrics_gateway_from_env() -> MetricsGateway:
    """The deployment's gateway, ``$ZOMBIE_PUSHGATEWAY_URL`` (a bad one stops the code location from loading)."""
    return MetricsGateway(gateway=config.pushgateway_url() or "")
