"""The benchmark runs end to end at a tiny size and produces its figures (performance is measured by
``python -m benchmarks.run``, never by tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` is not an installed package

from benchmarks.cleanup_bench import BASELINE, OURS, ratios  # noqa: E402
from benchmarks.run import GROWTH_PNG, RESULTS_JSON, RESULTS_MD, Config, run  # noqa: E402

pytestmark = pytest.mark.slow  # a whole benchmark run: run apart by .ci/run


def test_harness_produces_figures(tmp_path: Path) -> None:
    # the embedded server: the benchmark starts a fresh one per run (and a delay proxy in front of it)
    results = run(Config.smoke(), tmp_path, url=None, log=lambda line: None)
    assert results["meta"]["servers_started"] >= len(results["cleanup_runs"])

    # every run finalized exactly the zombies, on its own server, its writes counted from the server's replies
    runs = results["cleanup_runs"]
    assert runs and all(not row["timed_out"] and row["finalized"] == row["expected"] == 50 for row in runs)
    assert all(row["server_cpu_seconds"] is not None and row["documents_written"] > 0 for row in runs)
    timed = [row for row in runs if not row["traced"]]
    main_case = "2023-01:500:50:30"
    order = [(row["rtt_ms"], row["contender"]) for row in timed if row["case"] == main_case]
    assert order == [(0.0, OURS), (0.0, BASELINE), (1.0, OURS), (1.0, BASELINE)]  # interleaved, every RTT
    delayed = [row for row in timed if row["rtt_ms"] == 1.0]
    assert delayed and all(row["ping_ms"] > row["direct_ping_ms"] + 0.5 for row in delayed)  # the proxy adds the delay

    summary = {(row["case"], row["contender"], row["rtt_ms"]): row for row in results["cleanup"]}
    ours, baseline = summary[(main_case, OURS, 0.0)], summary[(main_case, BASELINE, 0.0)]
    assert ours["wall"]["median"] > 0 and ours["peak_python_mb"] > 0 and ours["all_finalized"]
    assert baseline["commands"] >= 2 * 50 > ours["commands"]  # one update and one cache upsert per zombie
    assert baseline["written_per_zombie"]["job"] == baseline["written_per_zombie"]["cache entry"] == 1.0
    # ours: claim, job, cache entry, one event completion per zombie, plus the retries
    assert ours["core_per_zombie"] == 4.0 and all(
        ours["written_per_zombie"][kind] == 1.0 for kind in ("claim", "job", "cache entry", "event completion")
    )
    today = next(row for row in results["cleanup"] if row["generation"] != "2023-01")
    assert today["written_per_zombie"]["deployment's collections"] > 0
    assert {row["rtt_ms"] for row in ratios(results["cleanup"])} == {0.0, 1.0}
    model = next(row for row in results["cleanup_models"] if row["case"] == main_case and row["contender"] == BASELINE)
    assert model["round_trips_fitted"] is not None and model["predicted_mongodb_seconds"]

    documents, arrow = results["compute"]
    assert (documents["path"], arrow["path"]) == ("documents", "arrow")
    assert documents["jobs_read"] == arrow["jobs_read"] == 2_000 and arrow["same_tallies_as_documents"]
    assert arrow["compute_median_seconds"] > 0 and documents["peak_python_mb"] > 0

    detection = results["detection"]
    assert [row["finished_jobs"] for row in detection] == [200, 400]
    assert all(row["zombies_found"] == 20 and row["docs_examined"] is not None for row in detection)
    variants = {row["variant"].split(" ")[0]: row for row in results["statistics"]}
    assert set(variants) == {"ours", "naive", "one"}
    assert variants["one"]["jobs_read"] == variants["one"]["jobs_finished_that_day"]
    # a daily partition sends no distinct and the server examines its own day's jobs only (issue 19)
    assert "distinct" not in variants["one"]["commands_by_name"]
    assert variants["one"]["docs_examined"] == variants["one"]["jobs_read"] > 0
    assert results["growth"]

    verdicts = {target["target"].split(" (")[0]: target for target in results["targets"]}
    assert verdicts["documents written per zombie <= 4 + retry"]["held"]
    assert verdicts["a daily partition makes the server examine only its own day"]["held"]
    assert any(name.startswith("cleanup commands across 30 job types") for name in verdicts)
    assert any(
        name.startswith("(for comparison, not a target) cleanup wall time") for name in verdicts
    )  # a target at 1,000 zombies only

    written = json.loads((tmp_path / RESULTS_JSON).read_text())
    assert written["meta"]["complete"] and written["cleanup"] == json.loads(json.dumps(results["cleanup"], default=str))
    markdown = (tmp_path / RESULTS_MD).read_text()
    assert "| case | contender | injected RTT ms" in markdown and "documents vs Arrow" in markdown
    assert (tmp_path / GROWTH_PNG).stat().st_size > 1000
