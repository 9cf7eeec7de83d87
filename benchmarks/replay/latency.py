"""The delays the replay does not measure itself: a run's start, the sensor's tick spacing, the watcher's release lag.

* **Run start, local stack** (:func:`measured_start`): queued-to-started of cleanups on the production stack of the
  tests, at idle and beside 4 CPU-bound processes, as ``scripts/cleanup_start.py --distribution`` measured them
  (``start_latency.json`` beside this module, with the load average of each run); the replay draws from the
  measured values (their tail included).
* **Run start, Kubernetes** (:func:`kubernetes_start`): the K8s run launcher starts a pod per run. A documented
  model, not a measure: the daemon's dequeue (uniform in its 5 s interval) + the pod's start (Kubernetes' pod
  startup SLO: p99 <= 5 s for a stateless pod whose image is on the node, excluding the pull; log-normal of median
  2 s) + the run worker's Python start (the local stack's measured median, ``start_latency.json``) + an image pull
  (0 on a warm node; ``pull_seconds`` on a cold one). Two values for the what-if: a warm node and a 60 s pull.
* **Sensor ticks** (:class:`TickSpacing`): Dagster's sensor daemon loops at least every ``MIN_INTERVAL_LOOP_TIME``
  = 5 s (``dagster/_daemon/sensor.py``) and evaluates a sensor once ``minimum_interval_seconds`` (30) has passed
  since its last tick: 30 s + up to a loop's 5 s + the evaluation.
* **The watcher's release lag** (:func:`release_lag`): measured where ``scripts/watch_release_lag.py`` wrote
  ``watch_release_lag.json`` beside the benchmarks (the true lag of every death of each of its runs on the production
  stack, the runs pooled), else a model: the refresh of the deadlines (uniform 0-2 s) + a finalize batch's cost as
  the witness replay measured it on the real cleanup.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
START_LATENCY_FILE = HERE / "start_latency.json"
WATCH_LAG_FILE = HERE.parent / "watch_release_lag.json"
MIN_INTERVAL_LOOP_SECONDS = 5.0  # dagster/_daemon/sensor.py


@dataclass(frozen=True)
class StartLatency:
    """Seconds from a run's request to its start: drawn from ``samples`` (measured) or from the Kubernetes model."""

    name: str
    label: str
    samples: tuple[float, ...] = ()
    dequeue_seconds: float = 5.0
    pod_median_seconds: float = 2.0
    pod_sigma: float = 0.4  # p99 2 x e^(2.33 x 0.4) = 5 s: the pod startup SLO
    worker_seconds: float = 0.0
    pull_seconds: float = 0.0
    source: str = ""

    def draw(self, rng: random.Random) -> float:
        if self.samples:
            return rng.choice(self.samples)
        pod = self.pod_median_seconds * math.exp(rng.gauss(0.0, self.pod_sigma))
        return rng.uniform(0.0, self.dequeue_seconds) + pod + self.worker_seconds + self.pull_seconds

    def described(self) -> dict[str, Any]:
        if self.samples:
            ordered = sorted(self.samples)
            return {
                "label": self.label,
                "n": len(ordered),
                "p50": statistics.median(ordered),
                "p90": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)],
                "max": ordered[-1],
                "source": self.source,
            }
        return {
            "label": self.label,
            "model": f"U(0, {self.dequeue_seconds:g}) dequeue + pod log-normal median {self.pod_median_seconds:g} s "
            f"(sigma {self.pod_sigma:g}) + worker start {self.worker_seconds:.1f} s + image pull {self.pull_seconds:g} s",
            "source": self.source,
        }


def measured_file(path: Path = START_LATENCY_FILE) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def measured_start(phase: str, document: dict[str, Any]) -> StartLatency:
    """One phase of ``scripts/cleanup_start.py --distribution`` (``idle`` or ``loaded``)."""
    runs = document["phases"][phase]
    loads = [run["load_average_1m"] for run in runs]
    hogs = f" beside {document['hogs']} CPU-bound processes" if phase == "loaded" else ""
    return StartLatency(
        f"local-{phase}",
        f"local stack, {phase}{hogs}",
        tuple(run["queued_to_started"] for run in runs),
        source=f"scripts/cleanup_start.py --distribution, {document['started_at']}, {len(runs)} runs, load average "
        f"{min(loads):.1f}-{max(loads):.1f} on {document['cpu_count']} cores",
    )


def kubernetes_start(pull_seconds: float, worker_seconds: float) -> StartLatency:
    warm = pull_seconds == 0
    return StartLatency(
        f"k8s-{'warm' if warm else f'pull{pull_seconds:g}'}",
        f"Kubernetes, a pod per run, {'image on the node' if warm else f'an image pull of {pull_seconds:g} s'} (model)",
        worker_seconds=worker_seconds,
        pull_seconds=pull_seconds,
        source="K8sRunLauncher: a pod per run; Kubernetes' pod startup SLO (p99 <= 5 s without the image pull); the "
        "worker's start from the local stack's measured median; the pull a what-if",
    )


def start_latencies(document: dict[str, Any] | None) -> list[StartLatency]:
    """The start latencies every sensor contender runs with: the local stack's two, Kubernetes' two."""
    if document is None:
        raise FileNotFoundError(
            f"{START_LATENCY_FILE} is missing: measure it first with "
            "`.venv/bin/python scripts/cleanup_start.py --distribution`"
        )
    idle, loaded = measured_start("idle", document), measured_start("loaded", document)
    worker = statistics.median(idle.samples)
    return [idle, loaded, kubernetes_start(0.0, worker), kubernetes_start(60.0, worker)]


@dataclass(frozen=True)
class TickSpacing:
    """Seconds between two ticks of a sensor of ``minimum_interval_seconds``: the interval, then the daemon's next
    loop (it loops at least every 5 s), plus the evaluation's own time."""

    minimum_seconds: float = 30.0
    evaluation_seconds: float = 0.1

    def draw(self, rng: random.Random) -> float:
        return self.minimum_seconds + rng.uniform(0.0, MIN_INTERVAL_LOOP_SECONDS) + self.evaluation_seconds


@dataclass(frozen=True)
class ReleaseLag:
    """The watcher's delay from a deadline to the finalize write."""

    samples: tuple[float, ...] = ()  # measured release lags (the watch work's production stack)
    refresh_seconds: float = 2.0  # the deadlines are refreshed every 1-2 s: a deadline is seen 0-2 s late
    finalize_seconds: tuple[float, ...] = field(default=(0.5,))  # a finalize batch's measured cost
    source: str = ""

    def draw(self, rng: random.Random) -> float:
        if self.samples:
            return rng.choice(self.samples)
        return rng.uniform(0.0, self.refresh_seconds) + rng.choice(self.finalize_seconds)


def release_lag(finalize_seconds: tuple[float, ...], path: Path = WATCH_LAG_FILE) -> ReleaseLag:
    """The watcher's lag: the true release lags of every run in ``watch_release_lag.json`` pooled (each run, keyed by
    its name, holds ``release_lag_samples_seconds`` and its ``conditions``), else refresh + a finalize batch's cost."""
    if path.exists():
        runs = json.loads(path.read_text())
        by_run = {name: [float(v) for v in run["release_lag_samples_seconds"]] for name, run in sorted(runs.items())}
        samples = sorted(v for values in by_run.values() for v in values)
        if not samples:
            raise ValueError(f"{path} holds no release_lag_samples_seconds: re-run scripts/watch_release_lag.py")
        described = ", ".join(
            f"{name} ({len(values)}, {runs[name]['conditions']['measured_at']})" for name, values in by_run.items()
        )
        p99 = samples[min(len(samples) - 1, math.ceil(0.99 * len(samples)) - 1)]
        return ReleaseLag(
            tuple(samples),
            source=f"measured: {path.name} (scripts/watch_release_lag.py on the production stack), the true lag of "
            f"every death of its {len(by_run)} runs pooled, {len(samples)} samples: {described}; p50 "
            f"{statistics.median(samples):.2f} s, p99 {p99:.2f} s, max {samples[-1]:.2f} s",
        )
    return ReleaseLag(
        finalize_seconds=finalize_seconds or (0.5,),
        source=f"model: uniform 0-2 s refresh + a finalize batch's cost ({len(finalize_seconds)} measured by the "
        "witness replay on the real cleanup)",
    )
