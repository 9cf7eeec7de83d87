"""The deployment's ``datasetBlockages``: datasets its rate limiter holds back for a while."""

from __future__ import annotations

from typing import Final

BLOCKAGES_COLLECTION = "datasetBlockages"


class Blockage:
    """Field names of ``datasetBlockages``: datasets whose jobs are not picked for a while."""

    DATASET: Final = "dataset"
    BLOCKED_AT: Final = "blocked_at"
