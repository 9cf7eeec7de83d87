"""The deployment's worker fleet as dataset-viewer's production chart runs it (f62009e05).

Read from ``chart/env/prod.yaml`` (``workers:``), ``chart/templates/worker/_hpa.yaml`` and ``_deployment.yaml``:

* three pools, each a Deployment with its HorizontalPodAutoscaler: **heavy** 4-40 pods (difficulty 70-100, grace
  120 s), **medium** 10-80 (40-70, 60 s), **light** 4-50 (0-40, 30 s): 18 to 170 pods in all;
* each HPA scales on one External metric, ``worker_size_jobs_count`` of its worker size (the jobs of its
  difficulty range, waiting and started: ``Queue.get_jobs_count_by_worker_size``), against a ``Value`` target
  (``targetQueueLength``: 50 heavy, 150 medium and light), so desired = ceil(pods x count / target) with
  Kubernetes' 10 % tolerance, moved by **one pod per 60 s** up and down (``behavior`` policies, no stabilization
  window). The metric is refreshed by the ``queueMetricsCollector`` cron every 10 minutes (``*/10``);
* scale-down is blind to occupancy: the chart sets no ``pod-deletion-cost``, so the ReplicaSet deletes the pods
  that have been ready the shortest time (by powers of two of their age, then at random), busy or not;
* a deploy (``helm upgrade``) recreates heavy and medium (the default ``Recreate``: every old pod SIGTERMed at once,
  the new ones started once they are gone) and rolls light (``RollingUpdate``, ``maxSurge: 0``,
  ``maxUnavailable: 25%``: a quarter of its pods at a time, the next quarter once their replacements are ready);
  ``terminationGracePeriodSeconds`` per pool, then SIGKILL.

:class:`Pool` holds one pool's values; :func:`desired_pods` and :func:`scale_down_choice` are the two rules the
generator (:mod:`.generate`) applies. The small fleet of a cluster incident is :data:`INCIDENT_POOLS`, a separate,
labelled case: it cannot happen under the chart's minimums.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

#: Kubernetes' HPA leaves the replicas alone while the usage ratio is within this of 1 (``--horizontal-pod-autoscaler-
#: tolerance``, default 0.1).
HPA_TOLERANCE = 0.1
HPA_PERIOD_SECONDS = 60.0  # one pod per 60 s, up and down (the chart's behavior policies)
METRIC_PERIOD_SECONDS = 600.0  # queueMetricsCollector: "*/10 * * * *"


@dataclass(frozen=True)
class Pool:
    """One worker Deployment of the chart and its autoscaler."""

    name: str
    min_pods: int
    max_pods: int
    target_backlog: int  # targetQueueLength of worker_size_jobs_count
    grace_seconds: float  # terminationGracePeriodSeconds
    difficulty: tuple[int, int]  # (workerDifficultyMin, workerDifficultyMax]: the jobs it takes
    rolling_share: float | None = None  # RollingUpdate's maxUnavailable; None: Recreate
    #: The offered load in busy pods, at night and at the day's peak (the jobs arriving keep this many pods busy):
    #: below the minimum at night (the pool shrinks to it), above the maximum by day (a backlog builds, the pool
    #: grows to its maximum), as the production queue's thousands of waiting jobs by day suggest.
    night_load_pods: float = 0.0
    peak_load_pods: float = 0.0

    def takes(self, difficulty: int) -> bool:
        low, high = self.difficulty
        return low < difficulty <= high or (low == 0 and difficulty == 0)


CHART_POOLS: tuple[Pool, ...] = (
    Pool("heavy", 4, 40, 50, 120.0, (70, 100), None, 2.0, 48.0),
    Pool("medium", 10, 80, 150, 60.0, (40, 70), None, 5.0, 96.0),
    Pool("light", 4, 50, 150, 30.0, (0, 40), 0.25, 2.0, 60.0),
)

#: A cluster incident: the node groups down to a handful of nodes for the day (not a state the chart's minimums allow).
INCIDENT_POOLS: tuple[Pool, ...] = (
    Pool("heavy", 1, 1, 50, 120.0, (70, 100), None, 1.2, 1.2),
    Pool("medium", 2, 2, 150, 60.0, (40, 70), None, 2.4, 2.4),
    Pool("light", 1, 1, 150, 30.0, (0, 40), 0.25, 1.2, 1.2),
)


def desired_pods(pool: Pool, pods: int, backlog: int) -> int:
    """The HPA's next replica count: desired = ceil(pods x backlog / target) outside the tolerance, clamped to the
    pool's range, moved by one pod at most (one per HPA period)."""
    ratio = backlog / pool.target_backlog
    desired = pods if abs(ratio - 1.0) <= HPA_TOLERANCE else math.ceil(pods * ratio)
    desired = min(max(desired, pool.min_pods), pool.max_pods)
    if desired > pods:
        return pods + 1
    if desired < pods:
        return pods - 1
    return pods


def scale_down_choice(ready_since: Sequence[float], now: float, rng: random.Random) -> int:
    """Which pod the ReplicaSet deletes (its position in ``ready_since``): the ones ready the shortest time, by powers
    of two of their age (``LogarithmicScaleDown``), at random among them; whether a pod is busy plays no part."""
    buckets = [math.floor(math.log2(max(now - since, 1.0))) for since in ready_since]
    youngest = min(buckets)
    return rng.choice([i for i, bucket in enumerate(buckets) if bucket == youngest])


def rolling_batch(pool: Pool, pods: int) -> int:
    """Pods a rolling update takes down at once: maxUnavailable rounded down, at least one."""
    share = pool.rolling_share if pool.rolling_share is not None else 1.0
    return max(1, math.floor(pods * share))


def day_share(t: float) -> float:
    """Where the day is between its night (0) and its peak (1), hour by hour (UTC): night 0-6 h, morning ramp,
    plateau 10-18 h, evening ramp."""
    hour = (t % 86_400.0) / 3600.0
    if hour < 6:
        return 0.0
    if hour < 10:
        return (hour - 6) / 4
    if hour < 18:
        return 1.0
    return (24 - hour) / 6
