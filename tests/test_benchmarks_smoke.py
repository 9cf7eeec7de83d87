"""The benchmark harness runs end to end on a tiny queue (figures only; performance is measured by
``python -m benchmarks.run``, never by tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` is not an installed package

from benchmarks.cleanup_bench import BASELINE, OURS  # noqa: E402
from benchmarks.run import GROWTH_PNG, RESULTS_JSON, RESULTS_MD, Config, run  # noqa: E402


def test_harness_produces_figures_and_ours_sends_fewer_commands(mongo_url: str, tmp_path: Path) -> None:
    results = run(Config.smoke(), tmp_path, url=mongo_url, log=lambda line: None)

    cleanup = {row["contender"]: row for row in results["cleanup"]}
    ours, baseline = cleanup[OURS], cleanup[BASELINE]
    for row in (ours, baseline):
        assert not row["timed_out"]
        assert row["finalized"] == row["zombies"] == 50
        assert row["wall_median_seconds"] > 0 and row["peak_python_mb"] > 0
        assert row["docs_returned"] > 0 and row["bytes_received"] > 0
    assert ours["commands"] < baseline["commands"]
    assert baseline["commands"] >= 2 * 50  # one update and one cache upsert per zombie

    detection = results["detection"]
    assert [row["finished_jobs"] for row in detection] == [200, 400]
    assert all(row["zombies_found"] == 20 and row["docs_examined"] is not None for row in detection)
    variants = {row["variant"].split(" ")[0]: row for row in results["statistics"]}
    assert set(variants) == {"ours", "naive", "one"}
    assert variants["one"]["jobs_read"] == variants["one"]["jobs_finished_that_day"]
    assert len(results["growth_cleanup"]) == 2 and results["growth"]
    (compute,) = results["compute"]
    assert compute["jobs_read"] == 2_000 and compute["compute_median_seconds"] > 0 and compute["peak_python_mb"] > 0
    assert any("commands" in target["target"] for target in results["targets"])

    written = json.loads((tmp_path / RESULTS_JSON).read_text())
    assert written["meta"]["complete"] and written["cleanup"] == json.loads(json.dumps(results["cleanup"], default=str))
    assert "| queue jobs |" in (tmp_path / RESULTS_MD).read_text()
    assert (tmp_path / GROWTH_PNG).stat().st_size > 1000
