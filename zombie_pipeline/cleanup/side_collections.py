"""Which of the deployment's collections around a job's life this cleanup keeps in step, resolved once per run.

dataset-viewer keeps counters (``jobTotalMetric``, ``workerTypeJobCounts``,
``cacheTotalMetric``), a rate limiter (``pastJobs``, ``datasetBlockages``) and
locks beside its queue; which of them a generation has is
``generations.QueueGeneration.side_collections``. The cleanup writes only to
those, and before December 2023 only to those that exist (they came and went
with releases).
"""

from __future__ import annotations

from dataclasses import dataclass

from zombie_pipeline.queue.cache import CACHE_METRICS_COLLECTION
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.job_metrics import JOB_METRICS_COLLECTION, JobMetric, metric_key
from zombie_pipeline.queue.store import Store


@dataclass(frozen=True)
class SideCollections:
    """Which of the deployment's collections this cleanup keeps in step: the generation's, where they exist."""

    generation: QueueGeneration
    kept: frozenset[str]
    #: ``jobTotalMetric`` rows are keyed by ``dataset_status`` too: as the rows there say, else as the generation does.
    by_dataset_status: bool

    @classmethod
    def of(cls, store: Store, generation: QueueGeneration) -> SideCollections:
        """The generation's collections; before 2023-12, those of them that exist.

        From 2023-12 (finished jobs deleted) the deployment writes its counters at its first job, creating them:
        so do we. Before, they came and went with releases (a recount in another database, then in step): kept
        only where they exist.
        """
        kept = generation.side_collections
        if generation.keeps_finished_jobs and kept:
            existing = store.queue_collection_names() | (
                {CACHE_METRICS_COLLECTION} if store.has_cache_metrics() else set()
            )
            kept &= existing
        row = store.job_metrics.find_one({}, {JobMetric.DATASET_STATUS: 1}) if JOB_METRICS_COLLECTION in kept else None
        by_dataset_status = JobMetric.DATASET_STATUS in row if row else generation.job_metrics_by_dataset_status
        return cls(generation, kept, by_dataset_status)

    def __contains__(self, collection: str) -> bool:
        return collection in self.kept

    @property
    def cache_metrics(self) -> bool:
        return CACHE_METRICS_COLLECTION in self.kept

    def job_metric_key(self, job_type: str, status: str) -> dict[str, str]:
        return metric_key(job_type, status, self.by_dataset_status)
