"""The deployment's ``datasetBlockages``: datasets its rate limiter holds back for a while, and their writes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pymongo.client_session import ClientSession
from pymongo.collection import Collection

from zombie_pipeline.queue.jobs import ID

BLOCKAGES_COLLECTION = "datasetBlockages"


class Blockage:
    """Field names of ``datasetBlockages``: datasets whose jobs are not picked for a while."""

    DATASET: Final = "dataset"
    BLOCKED_AT: Final = "blocked_at"


#: A dataset whose recorded runs of the last hour exceed this (times its multiplier) is blocked.
BLOCKAGE_THRESHOLD_SECONDS = 7_200
COMPUTE_MULTIPLIER_BY_DATASET = {"HuggingFaceFW/fineweb-2": 100}


def over_the_limit(dataset: str, seconds: int) -> bool:
    """Whether ``seconds`` of runs in the last hour block ``dataset``."""
    return seconds > BLOCKAGE_THRESHOLD_SECONDS * COMPUTE_MULTIPLIER_BY_DATASET.get(dataset, 1)


def blockages_of(
    blockages: Collection[Any], datasets: Iterable[str], session: ClientSession | None = None
) -> dict[str, Any]:
    """dataset -> ``_id`` of its blockage, for the blocked ones among ``datasets``."""
    found = blockages.find({Blockage.DATASET: {"$in": sorted(datasets)}}, {Blockage.DATASET: 1}, session=session)
    return {blockage[Blockage.DATASET]: blockage[ID] for blockage in found}


def block(
    blockages: Collection[Any], ids: Mapping[str, Any], now: dt.datetime, session: ClientSession | None = None
) -> None:
    """Block each dataset of ``ids`` under the blockage ``_id`` given, in one command."""
    blockages.insert_many(
        [
            {ID: blockage_id, Blockage.DATASET: dataset, Blockage.BLOCKED_AT: now}
            for dataset, blockage_id in sorted(ids.items())
        ],
        session=session,
    )
