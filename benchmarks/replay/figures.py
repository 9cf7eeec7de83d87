"""What a contender's outcome comes to against the trace's ground truth: issue 29's figures, targets and chart.

**Detection time** of a zombie: its first finalization (any actor's: the job deleted,
its unicity id, dataset and user slot free) minus its *true* death: the moment the
process died (crash, never started), was killed at the end of its SIGTERM grace
period, or, for a hang, stopped making progress. Never the last heartbeat, never
the moment a rule could first fire: a killer that waits long after a death pays for it.

**Mistakes**, per 10,000 started jobs:

* *live jobs finalized*: finalized as dead (missing or no heartbeat, SIGTERM) while
  the process still ran;
* *healthy runs stopped by T2*: a healthy run (a straggler included) stopped by
  ``kill_long_job`` or finalized as past its maximum duration by a cleanup (its
  result, if it comes, arrives over an error);
* *finalized twice*: two finalizing writes of one job (two passes of the
  deployment that both read it, or a cleanup and then the job's own ``kill_long_job``);
* *run twice at once*: the job was finalized while its process still ran, with an
  error the deployment re-runs (``JobManagerCrashedError``, below its 3 runs; or any
  error a contender re-enqueues at once), and the re-run could start, at the
  backfill's next pass (every 2 h) or at once, before the first process stopped.

**Waste**: worker-hours of hung jobs from their onset until their process really
stops (only ``kill_long_job`` or the pod's death stop one); dataset-hours blocked by
zombies (the sum of detection times; a zombie never finalized counts to the end of
the replay).

**Causes** (issue 30): every finalization by the cause its killer told (the
deployment tells none: every dead job is a ``JobManagerCrashedError`` to it, a
crash, and a job stopped at its maximum duration a timeout) and what became of its
retry, the causes told against the trace's truth, and the **runs spent on deploy
deaths**: the finalizing writes of SIGTERMed jobs (deploy waves, scale-downs) that
counted one of the job's failed runs (each of the deployment's does; the cleanup's
do where its policy says a deploy death costs one).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.replay_trace import (
    DAY,
    Cause,
    Ending,
    Fate,
    Outcome,
    Trace,
    constant,
    lifecycle,
    moment,
)
from zombie_pipeline.policy import SuggestionRules, ZombiePolicy
from zombie_pipeline.queue.documents import Reason, RetryOutcome, Status
from zombie_pipeline.statistics.analysis import DurationReport, analyze
from zombie_pipeline.statistics.tallies import Period, durations_array

#: Finalized as dead: the deployment writes JobManagerCrashedError, which its backfill re-runs.
DEAD_REASONS = frozenset({Reason.MISSING_HEARTBEAT, Reason.NEVER_HEARTBEATED, Reason.TERMINATED})
DEATHS = (Cause.CRASH, Cause.NEVER_STARTED, Cause.SIGTERM)
#: Deaths one at a time (no deploy wave): what a fleet's passes alone decide.
ISOLATED = (Cause.CRASH, Cause.NEVER_STARTED)
CAUSES = (Cause.CRASH, Cause.SIGTERM, Cause.NEVER_STARTED, Cause.HANG)
#: Fleet sizes (the autoscaler's target at the death) the p99 is split by.
FLEET_BINS = (("under 10", 0, 9), ("10-49", 10, 49), ("peak (50)", 50, 10_000))
PER_RUNS = 10_000
BACKFILL_SECONDS = 7_200.0  # dataset-viewer's backfill cron, every 2 h in production
PEAK_MARGIN_SECONDS = 30.0
SIGTERM_SPEEDUP = 2.0


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50/p90/p99 (numpy's linear interpolation) and max, in seconds; None without values."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None, "mean": None}
    array = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(array.max()),
        "mean": float(array.mean()),
    }


def _bin_of(workers: int) -> str:
    return next(name for name, low, high in FLEET_BINS if low <= workers <= high)


def next_backfill(at: float) -> float:
    return math.ceil(at / BACKFILL_SECONDS) * BACKFILL_SECONDS


def figures(trace: Trace, outcome: Outcome) -> dict[str, Any]:
    """Detection per cause and per fleet size, mistakes and waste of one contender, from the trace's ground truth."""
    end = trace.settings.end
    detection: dict[Cause, list[float]] = {cause: [] for cause in CAUSES}
    unfinalized: Counter = Counter()
    by_fleet: dict[str, list[float]] = {name: [] for name, _, _ in FLEET_BINS}
    isolated_by_fleet: dict[str, list[float]] = {name: [] for name, _, _ in FLEET_BINS}  # crash, never started
    mistakes: Counter = Counter()
    hung_seconds = blocked_seconds = 0.0
    finalized_by: Counter = Counter()
    by_cause: Counter = Counter()  # told cause -> finalizing writes
    retries: dict[str, Counter] = {}  # told cause -> retry outcome -> writes
    told: dict[str, Counter] = {}  # the trace's cause ("none": no zombie, a job stopped at T2) -> told cause -> jobs
    runs_on_deploy_deaths = 0
    for job in trace.jobs:
        life = lifecycle(job, outcome.max_duration)
        finals = sorted((f for f in outcome.finalizations.get(job.index, []) if f.at <= end), key=lambda f: f.at)
        first = finals[0] if finals else None
        for final in finals:
            by_cause[final.cause] += 1
            if final.retry is not None:
                retries.setdefault(final.cause, Counter())[final.retry] += 1
            runs_on_deploy_deaths += final.costs_run and life.cause is Cause.SIGTERM
        if first is not None:
            finalized_by[first.actor.value] += 1
            truth = life.cause.value if life.cause is not None else "none"
            told.setdefault(truth, Counter())[first.cause] += 1
        if len(finals) >= 2:
            mistakes["finalized_twice"] += 1
            actors = Counter(f.actor for f in finals)
            if any(count >= 2 for count in actors.values()):
                mistakes["finalized_twice_by_one_killer"] += 1
        if life.cause is not None:
            assert life.zombie_since is not None
            if first is None:
                unfinalized[life.cause] += 1
                blocked_seconds += end - life.zombie_since
            else:
                waited = first.at - life.zombie_since
                detection[life.cause].append(waited)
                blocked_seconds += waited
                if life.cause in DEATHS:
                    fleet = _bin_of(trace.fleet_at(life.zombie_since))
                    by_fleet[fleet].append(waited)
                    if life.cause in ISOLATED:
                        isolated_by_fleet[fleet].append(waited)
            if life.cause is Cause.HANG:
                hung_seconds += min(life.process_end, end) - life.zombie_since
        if job.fate in (Fate.HEALTHY, Fate.STRAGGLER):
            stopped = life.ending is Ending.KILL_LONG or (
                first is not None and first.reason == Reason.EXCEEDED_MAX_DURATION and first.at < job.natural_end
            )
            mistakes["healthy_stopped_by_t2"] += stopped
        if first is None or first.at >= life.process_end:
            continue
        # finalized while its process still ran
        if first.reason in DEAD_REASONS:
            mistakes["live_finalized"] += 1
        if life.ending is Ending.FINISHED:
            mistakes["late_results"] += 1  # the worker's result comes after our error
        # re-run at once when the killer re-enqueued it (a cleanup's retry, a timeout's included); else a dead reason's
        # error is the deployment's backfill's to re-run
        at_once = first.retry == RetryOutcome.ENQUEUED
        rerun_possible = first.reason in DEAD_REASONS or at_once
        rerun_at = first.at if at_once else next_backfill(first.at)
        if rerun_possible and rerun_at < life.process_end:
            mistakes["run_twice_at_once"] += 1
        mistakes["freed_while_running"] += 1
    runs = len(trace.jobs)
    deaths = [value for cause in DEATHS for value in detection[cause]]
    result: dict[str, Any] = {
        "contender": outcome.contender,
        "runs": runs,
        "detection": {
            cause.value: {"zombies": len(detection[cause]) + unfinalized[cause], "unfinalized": unfinalized[cause]}
            | quantiles(detection[cause])
            for cause in CAUSES
        },
        "deaths": {
            "zombies": len(deaths) + sum(unfinalized[c] for c in DEATHS),
            "unfinalized": sum(unfinalized[c] for c in DEATHS),
        }
        | quantiles(deaths),
        "deaths_by_fleet": {name: {"zombies": len(values)} | quantiles(values) for name, values in by_fleet.items()},
        "isolated_deaths_by_fleet": {
            name: {"zombies": len(values)} | quantiles(values) for name, values in isolated_by_fleet.items()
        },
        "mistakes": {
            name: mistakes[name]
            for name in (
                "live_finalized",
                "healthy_stopped_by_t2",
                "finalized_twice",
                "finalized_twice_by_one_killer",
                "run_twice_at_once",
                "freed_while_running",
                "late_results",
            )
        },
        "hung_worker_hours": hung_seconds / 3600.0,
        "dataset_hours_blocked": blocked_seconds / 3600.0,
        "first_finalized_by": dict(finalized_by),
        "causes": {
            "finalized": dict(by_cause),
            "retries": {cause: dict(outcomes) for cause, outcomes in retries.items()},
            "told_by_true_cause": {truth: dict(causes) for truth, causes in told.items()},
            "runs_spent_on_deploy_deaths": runs_on_deploy_deaths,
        },
        "counts": dict(outcome.counts),
        "wall_seconds": round(outcome.wall_seconds, 1),
        "cpu_seconds": dict(outcome.cpu_seconds),
        "settings": outcome.settings,
    }
    result["per_10k_runs"] = {name: value * PER_RUNS / runs for name, value in result["mistakes"].items()}
    return result


# --- the T2s the statistics suggest from the trace's first days ----------------------------------------------


def observed_period(trace: Trace, days: float, kill_long_job_seconds: float = 2400.0) -> Period:
    """The window's tallies as the deployment would record them under the chart's maxJobDurationSeconds:
    successful durations, runs stopped at T2 as censored ones, dead runs as errors without a duration."""
    end = days * DAY
    period = Period(start=moment(0.0), end=moment(end), source="replay trace")
    values: dict[str, dict[str, list[float]]] = {}
    for job in trace.jobs:
        if job.start >= end:
            continue
        life = lifecycle(job, constant(kill_long_job_seconds))
        if life.process_end > end:  # still running when the window closes: not in the window's tallies
            continue
        tally = period.tally(job.job_type)
        tally.started += 1
        lists = values.setdefault(job.job_type, {"success": [], "stopped": []})
        if life.ending is Ending.FINISHED:
            tally.statuses[Status.SUCCESS] += 1
            lists["success"].append(life.process_end - job.start)
        else:
            tally.statuses[Status.ERROR] += 1
            if life.ending is Ending.KILL_LONG:
                lists["stopped"].append(life.process_end - job.start)
                tally.zombies[Reason.EXCEEDED_MAX_DURATION] += 1
            else:
                tally.zombies[Reason.TERMINATED if life.ending is Ending.SIGTERM else Reason.MISSING_HEARTBEAT] += 1
        period.jobs_read += 1
    for job_type, lists in values.items():
        period.tallies[job_type].success = durations_array(lists["success"])
        period.tallies[job_type].stopped = durations_array(lists["stopped"])
    return period


def suggested_t2s(
    trace: Trace, days: float, policy: ZombiePolicy, rules: SuggestionRules = SuggestionRules()
) -> tuple[DurationReport, dict[str, int], int]:
    """``statistics.analysis.analyze`` on the first ``days``: the per-type T2 for the cleanup and one global value
    for kill_long_job, the largest per-type suggestion (every type's healthy runs must fit under one value; the report
    gives no global value of its own)."""
    report = analyze(
        observed_period(trace, days, policy.max_duration_seconds), policy, rules, computed_at=moment(days * DAY)
    )
    per_type = {entry.job_type: entry.suggested_t2_seconds for entry in report.types}
    return report, per_type, max(per_type.values(), default=policy.max_duration_seconds)


# --- targets -------------------------------------------------------------------------------------------------


def _p99(row: dict[str, Any] | None, *path: str) -> float | None:
    value: Any = row
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def targets(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 29's targets on the replay, each with what was measured and by how much it was missed."""
    by = {row["contender"]: row for row in rows}
    a, c, d = by.get("a"), by.get("c"), by.get("d")
    out: list[dict[str, Any]] = []

    def verdict(target: str, measured: str, held: bool | None, missed_by: str = "") -> None:
        out.append({"target": target, "measured": measured, "held": held, "missed_by": "" if held else missed_by})

    if a and c:
        for key, what in (
            ("deaths_by_fleet", "deaths: crash, never started, SIGTERM"),
            ("isolated_deaths_by_fleet", "isolated deaths: crash, never started"),
        ):
            peak, low = FLEET_BINS[-1][0], FLEET_BINS[0][0]
            ap, cp = _p99(a, key, peak, "p99"), _p99(c, key, peak, "p99")
            if ap is not None and cp is not None:
                verdict(
                    f"(c) p99 detection within 30 s of (a)'s at the peak fleet ({what})",
                    f"(c) {cp:.0f} s, (a) {ap:.0f} s",
                    cp <= ap + PEAK_MARGIN_SECONDS,
                    f"{cp - ap - PEAK_MARGIN_SECONDS:.0f} s over the 30 s allowed",
                )
            ap, cp = _p99(a, key, low, "p99"), _p99(c, key, low, "p99")
            if ap is not None and cp is not None:
                verdict(
                    f"(c) p99 detection below (a)'s when the fleet is under 10 workers ({what})",
                    f"(c) {cp:.0f} s, (a) {ap:.0f} s (n={c[key][low]['zombies']})",
                    cp < ap,
                    f"{cp - ap:.0f} s above",
                )
        ap, cp = _p99(a, "detection", "sigterm", "p99"), _p99(c, "detection", "sigterm", "p99")
        if ap is not None and cp is not None:
            verdict(
                "(c) p99 detection of SIGTERMed jobs at least 2x lower than (a)'s",
                f"(c) {cp:.0f} s, (a) {ap:.0f} s: {ap / cp:.2f}x" if cp else f"(c) {cp:.0f} s",
                cp * SIGTERM_SPEEDUP <= ap,
                f"{cp - ap / SIGTERM_SPEEDUP:.0f} s above {ap / SIGTERM_SPEEDUP:.0f} s",
            )
    if c:
        live = c["mistakes"]["live_finalized"]
        verdict("(c) 0 live jobs finalized despite 4-minute heartbeat gaps", f"{live}", live == 0, f"{live} jobs")
        twice, own = c["mistakes"]["finalized_twice"], c["mistakes"]["finalized_twice_by_one_killer"]
        verdict(
            "(c) 0 jobs finalized twice",
            f"{twice} ({own} by the cleanup twice; {twice - own} by the cleanup, then by the job's own kill_long_job)",
            twice == 0,
            f"{twice} jobs",
        )
    if a and c:
        spent, theirs = c["causes"]["runs_spent_on_deploy_deaths"], a["causes"]["runs_spent_on_deploy_deaths"]
        verdict(
            "(c) no run spent on deploy deaths (issue 30), where (a) spends one per SIGTERMed job it finalizes",
            f"(c) {spent}, (a) {theirs}",
            spent == 0,
            f"{spent} runs",
        )
    if a and d:
        verdict(
            "(d) fewer hung worker-hours than (a)",
            f"(d) {d['hung_worker_hours']:.1f} h, (a) {a['hung_worker_hours']:.1f} h",
            d["hung_worker_hours"] < a["hung_worker_hours"],
            f"{d['hung_worker_hours'] - a['hung_worker_hours']:.1f} h more",
        )
        ds, as_ = d["mistakes"]["healthy_stopped_by_t2"], a["mistakes"]["healthy_stopped_by_t2"]
        verdict(
            "(d) no more healthy runs stopped by T2 than (a)", f"(d) {ds}, (a) {as_}", ds <= as_, f"{ds - as_} more"
        )
        twice = d["mistakes"]["run_twice_at_once"]
        verdict("(d) no job run twice at once", f"{twice}", twice == 0, f"{twice} jobs")
    return out


# --- tables and chart ----------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def detection_table(rows: Sequence[dict[str, Any]], labels: dict[str, str]) -> str:
    lines = []
    for row in rows:
        named = [(cause.value.replace("_", " "), row["detection"][cause.value]) for cause in CAUSES]
        named.append(("all deaths (crash, SIGTERM, never started)", row["deaths"]))
        for name, stats in named:
            cells = [labels.get(row["contender"], row["contender"]), name, stats["zombies"]]
            cells += [_s(stats[key]) for key in ("p50", "p90", "p99", "max")]
            lines.append([*cells, stats["unfinalized"]])
    return _table(["contender", "cause", "zombies", "p50 s", "p90 s", "p99 s", "max s", "not finalized"], lines)


def mistakes_table(rows: Sequence[dict[str, Any]], labels: dict[str, str]) -> str:
    lines = []
    for row in rows:
        m, per = row["mistakes"], row["per_10k_runs"]

        def cell(name: str) -> str:
            return f"{m[name]} ({per[name]:.1f})"

        lines.append(
            [
                labels.get(row["contender"], row["contender"]),
                cell("live_finalized"),
                cell("healthy_stopped_by_t2"),
                cell("finalized_twice") + f", {m['finalized_twice_by_one_killer']} by one killer twice",
                cell("run_twice_at_once"),
                cell("freed_while_running"),
                f"{row['hung_worker_hours']:.1f}",
                f"{row['dataset_hours_blocked']:.1f}",
            ]
        )
    headers = [
        "contender",
        "live jobs finalized",
        "healthy runs stopped by T2",
        "finalized twice",
        "run twice at once",
        "freed while its process ran",
        "hung worker-hours",
        "dataset-hours blocked",
    ]
    return _table(headers, lines)


#: The retry outcomes a causes' table shows, in this order (zombie_pipeline's RetryOutcome values).
RETRY_COLUMNS = ("enqueued", "scheduled", "already_queued", "limit_reached", "not_retried", "quarantined")


def causes_table(rows: Sequence[dict[str, Any]], labels: dict[str, str]) -> str:
    """Per contender and told cause: the finalizing writes, what became of their retries, and (once per contender)
    the runs spent on deploy deaths."""
    lines = []
    for row in rows:
        causes = row["causes"]
        for position, (cause, count) in enumerate(sorted(causes["finalized"].items())):
            outcomes = causes["retries"].get(cause, {})
            retried = [str(outcomes.get(name, 0)) for name in RETRY_COLUMNS] if outcomes else ["backfill"] + [""] * 5
            spent = str(causes["runs_spent_on_deploy_deaths"]) if position == 0 else ""
            lines.append([labels.get(row["contender"], row["contender"]), cause, count, *retried, spent])
    headers = ["contender", "cause told", "finalized", *(name.replace("_", " ") for name in RETRY_COLUMNS)]
    return _table([*headers, "runs spent on deploy deaths"], lines)


def fleet_table(rows: Sequence[dict[str, Any]], labels: dict[str, str], key: str = "deaths_by_fleet") -> str:
    lines = []
    for row in rows:
        cells = [labels.get(row["contender"], row["contender"])]
        for name, _, _ in FLEET_BINS:
            stats = row[key][name]
            cells.append(f"{_s(stats['p99'])} / {_s(stats['p50'])} (n={stats['zombies']})")
        lines.append(cells)
    return _table(["contender", *(f"{name}: p99 / p50 s" for name, _, _ in FLEET_BINS)], lines)


def targets_table(found: Sequence[dict[str, Any]]) -> str:
    verdicts = {True: "**held**", False: "**missed**", None: "not measured"}
    return _table(
        ["target", "measured", "verdict", "missed by"],
        [[t["target"], t["measured"], verdicts[t["held"]], t["missed_by"] or ""] for t in found],
    )


def chart(
    rows: Sequence[dict[str, Any]], detections: dict[str, list[float]], labels: dict[str, str], path: Path
) -> None:
    """Left: each contender's detection times of deaths, as a distribution; right: the p99 by fleet size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    for contender, values in detections.items():
        if values:
            ordered = np.sort(np.asarray(values))
            left.step(
                ordered,
                np.arange(1, len(ordered) + 1) / len(ordered),
                where="post",
                label=labels.get(contender, contender),
            )
    left.set_xlabel("detection time of a death, s (true death -> finalized)")
    left.set_ylabel("share of deaths detected")
    left.set_title("Crash, SIGTERM, never started")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8, loc="lower right")
    width = 0.8 / max(len(rows), 1)
    for offset, row in enumerate(rows):
        values = [row["deaths_by_fleet"][name]["p99"] or 0.0 for name, _, _ in FLEET_BINS]
        positions = [i + offset * width for i in range(len(FLEET_BINS))]
        right.bar(positions, values, width, label=labels.get(row["contender"], row["contender"]))
    right.set_xticks([i + width * (len(rows) - 1) / 2 for i in range(len(FLEET_BINS))])
    right.set_xticklabels(
        [f"{name} workers" if name != "peak (50)" else "peak (50 workers)" for name, _, _ in FLEET_BINS]
    )
    right.set_ylabel("p99 detection time, s")
    right.set_title("p99 of deaths by fleet size at the death")
    right.grid(True, axis="y", alpha=0.3)
    right.set_ylim(
        0, max((row["deaths_by_fleet"][n]["p99"] or 0.0 for row in rows for n, _, _ in FLEET_BINS), default=1) * 1.35
    )
    right.legend(fontsize=8, ncol=2, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def death_detections(trace: Trace, outcome: Outcome) -> list[float]:
    """Every death's detection time (for the chart)."""
    values = []
    for job in trace.jobs:
        life = lifecycle(job, outcome.max_duration)
        finals = [f.at for f in outcome.finalizations.get(job.index, []) if f.at <= trace.settings.end]
        if life.cause in DEATHS and finals and life.zombie_since is not None:
            values.append(min(finals) - life.zombie_since)
    return values
