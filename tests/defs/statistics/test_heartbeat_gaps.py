"""The daily heartbeat gap tallies, and the window statistics that suggest a heartbeat timeout from them, materialized in
process against the test server."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from tests.helpers import METRICS_OFF, QUEUE_GENERATION, database_resources
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.defs.statistics.assets import (
    HEARTBEAT_TIMEOUT_METADATA,
    job_duration_statistics,
    job_duration_tallies,
)
from zombie_pipeline.defs.statistics.heartbeat_gaps import heartbeat_gap_tallies
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.store import Store
from zombie_pipeline.statistics.charts import INLINE_MARKDOWN_LIMIT
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_log import GapBatch, write_batch
from zombie_pipeline.statistics.window import analyze_window

URL_ENV = "ZOMBIE_GAPS_TEST_MONGO_URL"
DAYS = ("2024-03-09", "2024-03-10")
END = dt.datetime(2024, 3, 11, tzinfo=dt.UTC)


@pytest.fixture
def resources(mongo_url, store, monkeypatch):
    monkeypatch.setenv(URL_ENV, mongo_url)
    return {
        **database_resources(store, URL_ENV),
        "zombie_policy": ZombiePolicyResource(queue_generation=QUEUE_GENERATION),
        **METRICS_OFF,
    }


def plant(store: Store) -> dict[str, np.ndarray]:
    """Two days of a healthy fleet's gaps on light workers, and a few of a heavy type, as a watcher's flushes leave
    them."""
    rng = np.random.default_rng(4)
    planted = {}
    for day in DAYS:
        light, heavy = 60 + rng.gamma(2.0, 2.0, 3_000), 60 + rng.gamma(2.0, 4.0, 200)
        batch = GapBatch(f"planted-{day}")
        batch.tally(day, ("/splits", "light")).gaps = GapHistogram.of(light.tolist())
        batch.tally(day, ("/first-rows", "heavy")).gaps = GapHistogram.of(heavy.tolist())
        batch.tally(day, ("/first-rows", "heavy")).finished = GapHistogram.of([65.0, 70.0])
        write_batch(store.heartbeat_gaps, batch, END)
        planted[day] = np.concatenate([light, heavy])
    return planted


def _metadata(result: dg.ExecuteInProcessResult, asset: dg.AssetsDefinition) -> dict:
    (materialization,) = result.asset_materializations_for_node(asset.op.name)
    return {key: value.value for key, value in materialization.metadata.items()}


def test_the_window_suggests_the_heartbeat_timeout_of_its_days_gaps_as_a_direct_read_does(
    resources, store: Store, tmp_path
):
    planted = plant(store)
    with dg.instance_for_test() as instance:
        for day in DAYS:
            daily = dg.materialize([heartbeat_gap_tallies], partition_key=day, resources=resources, instance=instance)
            metadata = _metadata(daily, heartbeat_gap_tallies)
            assert metadata["gaps"] == len(planted[day]) and metadata["finished_jobs"] == 2
            assert "| `/splits` on light | 3,000 |" in metadata["types"]
            assert metadata["metrics_push"].startswith("off")
        window = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            selection=[job_duration_statistics],  # the window reads the stored gap tallies, not the log
            partition_key=DAYS[-1],
            resources=resources,
            instance=instance,
            run_config={
                "ops": {job_duration_statistics.op.name: {"config": {"reports_dir": str(tmp_path), "window_days": 2}}}
            },
        )

    metadata = _metadata(window, job_duration_statistics)
    policy = resources["zombie_policy"].policy()
    direct = analyze_window(store, QUEUE_GENERATIONS[QUEUE_GENERATION], policy, end=END, window_days=2).heartbeat
    assert direct is not None and direct.gaps == sum(len(gaps) for gaps in planted.values()) == 6_400
    assert metadata[HEARTBEAT_TIMEOUT_METADATA] == direct.suggested_seconds == 120  # lowered from 5 min
    chart = metadata["heartbeat_gaps_chart"]
    assert len(chart) < INLINE_MARKDOWN_LIMIT and "6,400 heartbeat gaps" in chart and "◀ suggested 2 min" in chart
    markdown = Path(metadata["markdown"]).read_text()
    assert "**Heartbeat timeout** (current 5 min" in markdown and "heartbeat_timeout_seconds: 120  # 2 min" in markdown
    assert "| `/first-rows` on heavy | 400 |" in markdown and "| `/splits` on light | 6,000 |" in markdown
    gaps_chart = Path(metadata["chart"]).with_name(Path(metadata["chart"]).stem + "_gaps.png")
    assert gaps_chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_window_without_gap_tallies_says_no_gap_was_observed(resources, store: Store, tmp_path):
    with dg.instance_for_test() as instance:
        window = dg.materialize(
            [job_duration_tallies, heartbeat_gap_tallies, job_duration_statistics],
            selection=[job_duration_statistics],
            partition_key=DAYS[-1],
            resources=resources,
            instance=instance,
            run_config={"ops": {job_duration_statistics.op.name: {"config": {"reports_dir": str(tmp_path)}}}},
        )

    metadata = _metadata(window, job_duration_statistics)
    assert metadata[HEARTBEAT_TIMEOUT_METADATA] == 300
    assert "no heartbeat gap observed in the window" in Path(metadata["markdown"]).read_text()


def test_a_document_of_the_log_that_cannot_be_read_is_counted_and_the_day_kept(resources, store: Store):
    planted = plant(store)
    store.heartbeat_gaps.insert_one({"day": DAYS[0], "type": "/x", "worker": "light", "gaps": {"60000": "many"}})
    with dg.instance_for_test() as instance:
        daily = dg.materialize([heartbeat_gap_tallies], partition_key=DAYS[0], resources=resources, instance=instance)

    metadata = _metadata(daily, heartbeat_gap_tallies)
    assert metadata["skipped_documents"] == 1 and metadata["gaps"] == len(planted[DAYS[0]])
    assert set(daily.output_for_node(heartbeat_gap_tallies.op.name).tallies) == {
        ("/splits", "light"),
        ("/first-rows", "heavy"),
    }
