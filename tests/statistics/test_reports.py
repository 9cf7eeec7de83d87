"""The duration report as files and text: Markdown table, YAML snippet, CSV, JSON, chart, summary."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from typing import Any, cast

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.helpers import found
from zombie_pipeline.defs.resources import ZombiePolicyResource
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState, FreeRuns
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import Job, Status
from zombie_pipeline.queue.reasons import Cause, Reason
from zombie_pipeline.statistics.analysis import analyze
from zombie_pipeline.statistics.charts import CHART_EDGES, INLINE_MARKDOWN_LIMIT, duration_chart, duration_charts
from zombie_pipeline.statistics.formatting import day_ranges, format_duration
from zombie_pipeline.statistics.gap_histogram import GapHistogram
from zombie_pipeline.statistics.gap_tallies import GapPeriod, GapTally
from zombie_pipeline.statistics.heartbeat_timeout import suggest_heartbeat_timeout
from zombie_pipeline.statistics.reports import markdown_table, policy_snippet, summary_text, write_reports
from zombie_pipeline.statistics.tallies import BadData, Period, Tally
from zombie_pipeline.statistics.window import window_report

UTC = dt.UTC
END = dt.datetime(2024, 3, 8, tzinfo=UTC)


def _tally(success, error=(), zombies=None) -> Tally:
    return Tally(
        statuses=cast(Counter[Any], {Status.SUCCESS: len(success), Status.ERROR: len(error)}),
        started=len(success) + len(error),
        success=np.asarray(success, dtype=np.float32),
        error=np.asarray(error, dtype=np.float32),
        zombies=cast(Counter[Any], zombies or {}),
    )


@pytest.fixture
def report():
    """Three types: one to lower, one censored, one without enough data; an override kept."""
    rng = np.random.default_rng(0)
    tallies = {
        "/fast": _tally(rng.lognormal(np.log(3), 0.5, 400), zombies={Reason.MISSING_HEARTBEAT: 2}),
        "/slow": _tally(rng.lognormal(np.log(300), 1.0, 300).clip(max=1199), error=[1200.0] * 20),
        "/rare|odd": _tally([50.0] * 5),
    }
    period = Period(
        start=END - dt.timedelta(days=7),
        end=END,
        tallies=tallies,
        bad_data=cast(Counter[Any], {BadData.MISSING_STARTED_AT: 3}),
    )
    policy = ZombiePolicy(max_duration_seconds_by_type={"/rare|odd": 2400, "/gone": 900})
    return analyze(period, policy, computed_at=END)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "–"),
        (4.114, "4.11 s"),
        (42.4, "42 s"),
        (300, "5 min"),
        (1321, "22 min 1 s"),
        (3600, "1 h"),
        (4500, "1 h 15 min"),
    ],
)
def test_durations_read_in_the_units_of_a_timeout(seconds, text):
    assert format_duration(seconds) == text


def test_the_markdown_tables_have_a_row_per_type_with_runs_then_current_and_suggested_t2(report):
    table = markdown_table(report)
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    headers = [line for line in table.splitlines() if line.startswith("| type")]

    assert len(headers) == 2 and len(rows) == 2 * len(report.types)  # the runs, then the maximum durations
    runs, rows = rows[: len(report.types)], rows[len(report.types) :]
    assert [row.split(" | ")[0] for row in rows] == ["| `/fast`", "| `/gone`", "| `/rare\\|odd`", "| `/slow`"]
    assert all(row.count(" | ") == headers[0].count(" | ") for row in runs)  # the pipe in a type name is escaped
    assert all(row.count(" | ") == headers[1].count(" | ") for row in rows)
    assert all(len(header.split(" | ")) <= 12 for header in headers)  # narrow enough for the UI's dialog
    fast = rows[0]
    assert "20 min" in fast and "**5 min** (lower)" in fast and "kills 0/400 successes" in fast
    assert "lower bound" in rows[3]
    assert "not enough data" in rows[2]
    assert "missing_started_at 3" in table


def test_the_policy_snippet_is_run_config_the_policy_resource_accepts(report):
    config = yaml.safe_load(policy_snippet(report))

    by_type = config["resources"]["zombie_policy"]["config"]["max_duration_seconds_by_type"]
    assert by_type == {
        "/fast": 300,
        "/slow": 1800,  # censored: raised to the lower bound of its p99 (20 min) x 1.5
        "/rare|odd": 2400,  # no suggestion: the override stays
        "/gone": 900,
    }
    policy = ZombiePolicyResource(**config["resources"]["zombie_policy"]["config"]).policy()
    assert policy.max_duration_of("/fast") == 300


def test_the_policy_snippet_holds_the_changes_and_the_overrides_they_leave_never_a_type_kept_at_the_default():
    steady = {"/steady": _tally([10.0] * 280)}  # points to 5 min, but 280 runs cannot lower T2: kept at 20 min
    policy = ZombiePolicy(max_duration_seconds_by_type={"/configured": 2400})
    changed = analyze(
        Period(start=END - dt.timedelta(days=7), end=END, tallies={**steady, "/fast": _tally([10.0] * 400)}), policy
    )
    unchanged = analyze(Period(start=END - dt.timedelta(days=7), end=END, tallies=steady), policy)

    snippet = policy_snippet(changed)

    assert changed.t2_changes() == {"/fast": 300} and changed.suggested_max_durations() == {
        "/fast": 300,
        "/steady": 1200,
    }
    assert yaml.safe_load(snippet)["resources"]["zombie_policy"]["config"]["max_duration_seconds_by_type"] == {
        "/fast": 300,
        "/configured": 2400,  # left out, it would fall back to the default T2: the mapping replaces the configured one
    }
    assert snippet.startswith("# 1 T2 changes (0 raised, 1 lowered); the overrides they leave are kept")
    assert '"/fast": 300  # 5 min, lowered from 20 min' in snippet
    assert '"/configured": 2400  # 40 min, configured, kept' in snippet
    assert policy_snippet(unchanged) == "# No change: every job type keeps its current T2.\n"
    assert yaml.safe_load(policy_snippet(unchanged)) is None  # pasted, it changes nothing


def test_report_files_hold_the_statistics_the_suggestions_and_a_chart(report, tmp_path):
    files = write_reports(report, tmp_path / "reports")

    frame = pd.read_csv(files.csv)
    assert frame["type"].tolist() == ["/fast", "/gone", "/rare|odd", "/slow"]
    assert frame.set_index("type").loc["/fast", "suggested_t2_seconds"] == 300
    assert frame.set_index("type").loc["/fast", "zombies_missing_heartbeat"] == 2
    document = json.loads(files.json.read_text())
    assert document["suggested_max_duration_seconds_by_type"] == report.suggested_max_durations()
    assert document["t2_changes"] == {"/fast": 300, "/slow": 1800}
    assert document["window_complete"] is True
    assert document["deployment_max_job_duration"]["seconds"] == 1800
    assert document["types"][0]["runs_to_lower"] is None and document["types"][3]["p99_at_least_seconds"] == 1200.0
    assert document["bad_data"] == {BadData.MISSING_STARTED_AT: 3}
    assert document["types"][0]["success_p99"] == pytest.approx(report.type_report("/fast").statistics["p99"])
    assert "max_duration_seconds_by_type" in document["zombie_policy_snippet"]
    assert files.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and files.chart.stat().st_size > 20_000
    assert "```yaml" in files.markdown.read_text()


def test_an_empty_window_still_makes_a_report(tmp_path):
    report = analyze(Period(start=END - dt.timedelta(days=7), end=END), ZombiePolicy())

    files = write_reports(report, tmp_path)

    frame = pd.read_csv(files.csv)
    assert frame.empty and {"type", "suggested_t2_seconds", "backtest_successes_stopped"} <= set(frame.columns)
    assert files.chart.exists()
    assert policy_snippet(report) == "# No change: every job type keeps its current T2.\n"
    assert "no value: no type has the 30 successful runs a suggestion needs" in markdown_table(report)


def test_the_summary_gives_a_few_lines_per_type_and_the_snippet(report, tmp_path):
    files = write_reports(report, tmp_path)

    text = summary_text(report, files)

    assert "/fast: 400 success; zombie rate 0.5%" in text
    assert "T2 20 min -> 5 min (lower)" in text
    assert "! censored" in text and "not enough data" in text
    assert str(files.chart) in text
    assert text.count("\n") < 8 * len(report.types) + 15
    assert '"/fast": 300' in text


# --- a window with days missing -------------------------------------------------------------------------------


def test_a_partial_window_says_so_and_its_files_never_replace_the_full_reports(report, tmp_path):
    full = write_reports(report, tmp_path)
    partial_report = analyze(
        Period(start=report.window_start, end=report.window_end, tallies={"/fast": _tally([3.0] * 40)}),
        ZombiePolicy(),
        missing_days=["2024-03-01", "2024-03-02"],
    )

    partial = write_reports(partial_report, tmp_path)

    assert full.markdown.name == "durations_2024-03-01_2024-03-07.md"
    assert partial.markdown.name == "durations_2024-03-01_2024-03-07_partial-5of7.md"
    assert {path.stem for path in tmp_path.iterdir()} == {full.markdown.stem, partial.markdown.stem}
    assert "/slow" in full.markdown.read_text()  # the fuller report, as it was
    assert (partial_report.days_present, partial_report.days_expected) == (5, 7)
    assert markdown_table(report).splitlines()[0].endswith("UTC (complete: 7 days)**")
    table = markdown_table(partial_report)
    assert table.splitlines()[0].endswith("UTC (partial: 5 of its 7 days; lacks 2024-03-01 – 2024-03-02)**")
    assert "Partial window: it lacks 2024-03-01 – 2024-03-02" in table and "on its other 5 days" in table
    document = json.loads(partial.json.read_text())
    assert (document["days_present"], document["window_complete"]) == (5, False)


def test_lacking_days_are_written_as_runs_of_consecutive_days():
    assert day_ranges(["2024-03-05", "2024-03-01", "2024-03-02", "2024-03-03", "2024-03-08"]) == (
        "2024-03-01 – 2024-03-03, 2024-03-05, 2024-03-08"
    )
    assert day_ranges(["2024-02-29", "2024-03-01"]) == "2024-02-29 – 2024-03-01"


# --- the deployment's one T2 for every type ------------------------------------------------------------------------


def test_the_report_gives_the_deployments_one_t2_with_the_types_it_would_cut_short(report):
    table = markdown_table(report)
    cut = analyze(
        Period(
            start=report.window_start,
            end=report.window_end,
            tallies={"/fast": _tally([10.0] * 400), "/rare": _tally([200.0] * 3 + [900.0] * 2)},
        ),
        ZombiePolicy(),
    )

    [section] = [line for line in table.splitlines() if line.startswith("**One T2 for every type**")]
    assert "`MAX_JOB_DURATION_SECONDS`" in section and "its Helm chart sets 2400 s" in section
    assert "the data supports **30 min** (`MAX_JOB_DURATION_SECONDS=1800`), the suggestion for `/slow`." in section
    assert "It would cut no successful run of the window short." in section
    assert "possibly cut short still: `/slow`" in section and "Too few runs to tell: `/gone`, `/rare|odd`." in section
    assert "It would cut short `/rare` (not enough data): 2 of its 5 successful runs." in markdown_table(cut)
    assert "supports 5 min (MAX_JOB_DURATION_SECONDS=300)" in summary_text(cut)


# --- the chart in text, for the UI ------------------------------------------------------------------------------


ROW = re.compile(r" – \S+(?: \S+)?\s+(\d+)")  # a bin's upper edge ("30 min", "more"), then its count


def chart_rows(chart: str) -> list[str]:
    return [line for line in chart.splitlines() if " – " in line]


def test_the_report_gives_the_detection_time_of_each_reason_at_p50_and_p99(tmp_path):
    window = Period(start=END - dt.timedelta(days=7), end=END, tallies={"/a": _tally([10.0] * 40)})
    window.detection = {Reason.MISSING_HEARTBEAT: np.arange(301, 401, dtype=np.float32)}

    report = analyze(window, ZombiePolicy(), computed_at=END)

    [times] = report.detection
    assert (times.reason, times.zombies, times.p50_seconds, times.p99_seconds, times.max_seconds) == (
        Reason.MISSING_HEARTBEAT, 100, 350.5, 399.0, 400.0,
    )  # fmt: skip
    assert "| missing_heartbeat | 100 | 5 min 50 s | 6 min 39 s | 6 min 40 s |" in markdown_table(report)
    assert "detection time, missing_heartbeat: p50 5 min 50 s, p99 6 min 39 s (100 zombies)" in summary_text(report)
    files = write_reports(report, tmp_path)
    detection = json.loads(files.json.read_text())["detection_seconds_by_reason"]
    assert detection[Reason.MISSING_HEARTBEAT]["p99_seconds"] == 399.0


def test_the_report_counts_the_windows_finalizations_per_type_and_cause(tmp_path):
    window = Period(start=END - dt.timedelta(days=7), end=END, tallies={"/a": _tally([10.0] * 40)})
    report = analyze(window, ZombiePolicy(), computed_at=END)
    report.causes = {"/a": {Cause.DEPLOY: 50, Cause.CRASH: 2}, "/b": {Cause.TIMEOUT: 1}}

    assert "| `/a` | 50 | 2 | 0 | 0 |" in markdown_table(report)
    assert "| `/b` | 0 | 0 | 0 | 1 |" in markdown_table(report)
    assert "finalized by cause: 50 deploy, 2 crash, 0 never_started, 1 timeout" in summary_text(report)
    causes = json.loads(write_reports(report, tmp_path).json.read_text())["finalized_by_type_and_cause"]
    assert causes == {"/a": {"deploy": 50, "crash": 2}, "/b": {"timeout": 1}}


def test_the_text_chart_is_a_log_scale_histogram_of_the_successes_with_both_t2_marked(report):
    fast = report.type_report("/fast")

    chart = duration_chart(fast)

    assert chart.startswith("```text\n/fast: 400 successful runs, p50 ") and chart.endswith("\n```")
    rows = chart_rows(chart)
    assert sum(int(found(ROW.search(row)).group(1)) for row in rows) == 400
    lows = [row.split(" – ")[0].strip() for row in rows]  # from the shortest run's bin to the current T2's
    assert lows == [
        format_duration(edge) for edge in CHART_EDGES[CHART_EDGES.index(0.2) : CHART_EDGES.index(1_200) + 1]
    ]
    assert max(row.count("█") for row in rows) == 20  # the fullest bin is a full bar
    [current] = [row for row in rows if "current T2" in row]
    [suggested] = [row for row in rows if "suggested T2" in row]
    assert current.strip().startswith("20 min – 30 min") and current.endswith("◀ current T2 20 min")
    assert suggested.strip().startswith("5 min – 10 min") and suggested.endswith("◀ suggested T2 5 min (lower)")


def test_every_chart_is_short_enough_for_the_ui_to_show_it_inline_however_wide_the_durations(report):
    spread = analyze(
        Period(
            start=report.window_start, end=report.window_end, tallies={"/wide": _tally(np.geomspace(0.1, 600_000, 500))}
        ),
        ZombiePolicy(),
    )

    charts = {**duration_charts(report), **duration_charts(spread)}

    assert set(charts) == {"/fast", "/gone", "/rare|odd", "/slow", "/wide"}
    assert all(len(chart) < INLINE_MARKDOWN_LIMIT for chart in charts.values())
    assert "0 successful runs" in charts["/gone"] and "current T2 15 min" in charts["/gone"]
    assert "not enough data" in charts["/rare|odd"]
    assert "20 more stopped at T2" in charts["/slow"]
    assert "more" in chart_rows(charts["/wide"])[-1].split(" – ")[1]  # the last bin has no upper edge


def test_the_report_lists_the_pairs_that_used_up_their_free_re_runs(store, tmp_path):
    spent = {FreeRuns.ALONE: 4, FreeRuns.FREE: 3, FreeRuns.LIMIT: 3, FreeRuns.WINDOW_HOURS: 72, FreeRuns.CHARGED: True}
    store.events.insert_one(
        {
            Event.JOB: {Job.DATASET: "user/evicted", Job.TYPE: "/a"},
            Event.REASON: Reason.TERMINATED,
            Event.CAUSE: Cause.CRASH,
            Event.FINALIZED_AT: END - dt.timedelta(hours=1),
            Event.STATE: EventState.DONE,
            Event.FREE_RUNS: spent,
        }
    )
    start = END - dt.timedelta(days=7)
    report = window_report(store, QUEUE_GENERATIONS["2026-05"], ZombiePolicy(), [], start, END)

    assert "| `user/evicted` | `/a` | 1 | 1 | 3 in 72 h | 2024-03-07 23:00:00 |" in markdown_table(report)
    assert "free re-runs used up (SIGTERMed alone past them): user/evicted /a" in summary_text(report)
    listed = json.loads(write_reports(report, tmp_path).json.read_text())["free_runs_spent"]
    assert [(row["dataset"], row["charged"]) for row in listed] == [("user/evicted", 1)]


def test_a_report_with_heartbeat_gaps_gives_the_timeout_they_support_in_every_file(report, tmp_path):
    gaps = GapTally(gaps=GapHistogram.of((60 + np.random.default_rng(1).gamma(2.0, 2.0, 5_000)).tolist()))
    report.heartbeat = suggest_heartbeat_timeout(
        GapPeriod(start=report.window_start, end=report.window_end, tallies={("/fast", "light"): gaps}),
        ZombiePolicy(),
        report.heartbeat_deaths,
    )

    files = write_reports(report, tmp_path)

    assert report.heartbeat_deaths == 2  # /fast's two missing heartbeats
    markdown = files.markdown.read_text()
    assert "**Heartbeat timeout** (current 5 min" in markdown and "| `/fast` on light | 5,000 |" in markdown
    assert f"heartbeat_timeout_seconds: {report.heartbeat.suggested_seconds}  #" in markdown
    document = json.loads(files.json.read_text())["heartbeat_timeout"]
    assert document["suggested_seconds"] == report.heartbeat.suggested_seconds < 300
    assert document["rows"][0]["gaps"] == 5_000 and document["deaths"] == 2
    assert files.gap_chart is not None and files.gap_chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = summary_text(report, files)
    assert f"heartbeat timeout 5 min -> {format_duration(report.heartbeat.suggested_seconds)} (lower)" in summary
    assert str(files.gap_chart) in summary
