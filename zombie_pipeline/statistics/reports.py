"""The duration report as people read it: a Markdown table, a YAML snippet, CSV, JSON and a chart.

Over 500 lines: every format of one report, each a short function of it.

Everything here formats a :class:`~zombie_pipeline.statistics.suggest.DurationReport`;
nothing reads the database. No Dagster either: the assets put these strings and
paths into metadata, the CLI prints :func:`summary_text`.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zombie_pipeline import config
from zombie_pipeline.messages import counted
from zombie_pipeline.queue.jobs import Status
from zombie_pipeline.queue.reasons import CAUSES, REASONS
from zombie_pipeline.statistics.analysis import DurationReport, TypeReport
from zombie_pipeline.statistics.charts import plot_durations, plot_gaps
from zombie_pipeline.statistics.formatting import day_ranges, format_duration, format_share, window_text
from zombie_pipeline.statistics.formatting import table_lines as _table
from zombie_pipeline.statistics.heartbeat_report import heartbeat_json, heartbeat_markdown, heartbeat_summary
from zombie_pipeline.statistics.offenders import RepeatOffenders
from zombie_pipeline.statistics.quantiles import percentile_name, runs_for_upper_bound
from zombie_pipeline.statistics.tallies import SOURCES

#: The deployment's one maximum duration for every job, as its workers read it, and the value its Helm chart sets.
DEPLOYMENT_MAX_DURATION_SETTING = "MAX_JOB_DURATION_SECONDS"
DEPLOYMENT_CHART_MAX_DURATION_SECONDS = 2400


@dataclass(frozen=True)
class ReportFiles:
    csv: Path
    json: Path
    chart: Path
    markdown: Path
    gap_chart: Path | None = None  # the heartbeat gaps, where the window has some


def _interval(entry: TypeReport) -> str:
    if entry.quantile_seconds is None:
        return "–"
    low = (
        format_duration(entry.quantile_low_seconds) if entry.quantile_low_seconds is not None else "no lower bound yet"
    )
    high = (
        format_duration(entry.quantile_high_seconds)
        if entry.quantile_high_seconds is not None
        else "no upper bound yet: too few runs"
    )
    return f"{format_duration(entry.quantile_seconds)} [{low}, {high}]"


def _backtest(entry: TypeReport) -> str:
    if not entry.enough_data:
        return "–"
    parts = [f"kills {entry.backtest_successes_stopped}/{entry.successes} successes"]
    if entry.backtest_stopped_sooner:
        parts.append(
            f"stops {entry.backtest_stopped_sooner} overruns sooner "
            f"(saves {format_duration(entry.backtest_seconds_saved)})"
        )
    if entry.backtest_given_more_time:
        parts.append(f"gives {entry.backtest_given_more_time} stopped jobs more time")
    return "; ".join(parts)


def markdown_table(report: DurationReport) -> str:
    """Two tables of a row per job type, narrow enough for a dialog: the runs, then the maximum duration (T2)."""
    q = percentile_name(report.rules.quantile)
    statuses = [
        status
        for status in (Status.SUCCESS, Status.ERROR, Status.CANCELLED, Status.SKIPPED)
        if status in (Status.SUCCESS, Status.ERROR) or any(entry.statuses.get(status) for entry in report.types)
    ]
    runs_header = [
        "type",
        *statuses,
        "zombies (crashed / never beat / SIGTERM / too long)",
        "zombie rate",
        "p50",
        "p90",
        "p99",
        "max",
    ]
    t2_header = [
        "type",
        "current T2",
        "suggested T2",
        f"{q} [{report.rules.confidence:.0%} CI]",
        "stopped at T2",
        "backtest",
        "flags",
    ]
    runs_rows, t2_rows = [], []
    for entry in report.types:
        stats = entry.statistics
        name = f"`{entry.job_type}`"
        suggested = format_duration(entry.suggested_t2_seconds)
        if entry.enough_data and entry.change != "keep":
            suggested = f"**{suggested}** ({entry.change})"
        runs_rows.append(
            [
                name,
                *(str(entry.statuses.get(status, 0)) for status in statuses),
                " / ".join(str(entry.zombies.get(reason, 0)) for reason in REASONS),
                format_share(entry.zombie_rate),
                *(format_duration(stats[name]) for name in ("p50", "p90", "p99", "max")),
            ]
        )
        t2_rows.append(
            [
                name,
                format_duration(entry.current_t2_seconds),
                suggested,
                _interval(entry),
                f"{entry.stopped} ({format_share(entry.stopped_share)})" if entry.stopped else "0",
                _backtest(entry),
                "; ".join(entry.flags) or "–",
            ]
        )
    lines = [
        f"**Job durations {window_text(report)}**",
        "",
        *_table(runs_header, runs_rows),
        "",
        f"**Maximum duration (T2)**: suggested = {q} × {report.rules.margin:g}, rounded up, at least the heartbeat "
        f"timeout ({format_duration(report.heartbeat_timeout_seconds)}); at least {report.rules.min_samples} successful "
        f"runs needed. {_changes_text(report)}",
        "",
        *_table(t2_header, t2_rows),
        "",
        deployment_limit_text(report),
        "",
        detection_text(report),
        "",
        *causes_table(report),
        "",
        *free_runs_lines(report.free_runs_spent),
        "",
        *(heartbeat_markdown(report.heartbeat) + [""] if report.heartbeat is not None else []),
        _data_notes(report),
    ]
    return "\n".join(lines).rstrip() + "\n"


def detection_text(report: DurationReport) -> str:
    """How late the window's zombies were finalized, per reason, and those seen alive afterwards (docs/detection.md)."""
    late = late_results_text(report)
    if not report.detection:
        return late
    rows = [
        [
            times.reason,
            str(times.zombies),
            format_duration(times.p50_seconds),
            format_duration(times.p99_seconds),
            format_duration(times.max_seconds),
        ]
        for times in report.detection
    ]
    intro = (
        "**Detection time**: from a dead job's last heartbeat, start or SIGTERM to its finalization; for one stopped "
        f"at its T2, from that deadline. Heartbeat timeout {format_duration(report.heartbeat_timeout_seconds)}."
    )
    return "\n".join([intro, "", *_table(["reason", "zombies", "p50", "p99", "max"], rows), "", late]).rstrip()


def causes_table(report: DurationReport) -> list[str]:
    """The window's finalizations per job type and cause (docs/causes.md): what a deploy cost, what crashed."""
    if not report.causes:
        return []
    rows = [
        [f"`{job_type}`", *(str(by_cause.get(cause, 0)) for cause in CAUSES)]
        for job_type, by_cause in report.causes.items()
    ]
    intro = "**Finalizations by cause** (docs/causes.md): a deploy's deaths cost no run; crashes count as the deployment counts them."
    return [intro, "", *_table(["type", *CAUSES], rows)]


def free_runs_lines(spent: Sequence[dict[str, Any]], max_rows: int = 20) -> list[str]:
    """The (dataset, job type) pairs that used up their free re-runs (docs/causes.md, "Free re-runs have a budget"):
    SIGTERMed alone more often than deployments explain, each one past the budget charged as a crash."""
    if not spent:
        return []
    intro = (
        f"**Free re-runs used up**: {len(spent)} (dataset, job type) pairs SIGTERMed alone more often than their free "
        "re-runs allow (an eviction for memory, most likely); each one past them counted as a crash."
    )
    header = ["dataset", "type", "SIGTERMed alone", "charged as crashes", "free within", "last"]
    rows = [
        [
            f"`{row['dataset']}`",
            f"`{row['type']}`",
            str(row["terminated_alone"]),
            str(row["charged"]),
            f"{row['free_limit']} in {row['window_hours']} h",
            row["last"],
        ]
        for row in spent[:max_rows]
    ]
    more = ["", f"Not listed: {len(spent) - max_rows} more pairs."] if len(spent) > max_rows else []
    return [intro, "", *_table(header, rows), *more]


def causes_line(report: DurationReport) -> str:
    totals = {cause: sum(by_cause.get(cause, 0) for by_cause in report.causes.values()) for cause in CAUSES}
    return "finalized by cause: " + ", ".join(f"{count} {cause}" for cause, count in totals.items())


def late_results_text(report: DurationReport) -> str:
    """The job types whose finalized jobs showed life afterwards: detection's mistakes."""
    if not report.late_results:
        return "**Late results**: none (no finalized job showed life afterwards)."
    counts = ", ".join(f"`{job_type}` {count}" for job_type, count in sorted(report.late_results.items()))
    return f"**Late results** (finalized jobs that showed life afterwards: a heartbeat, their own result): {counts}."


def _changes_text(report: DurationReport) -> str:
    """How many types change T2, and why the others that point lower do not: the size of the window's data."""
    raised = sum(entry.changes_t2 and entry.change == "raise" for entry in report.types)
    lowered = sum(entry.changes_t2 and entry.change == "lower" for entry in report.types)
    text = f"{raised + lowered} of {len(report.types)} types change T2 ({raised} raised, {lowered} lowered)."
    withheld = [entry.job_type for entry in report.types if entry.lowering_withheld]
    if withheld:
        q = percentile_name(report.rules.quantile)
        text += (
            f" Lowering withheld for want of runs for {_names(withheld)}: lowering a T2 needs an upper bound of the {q} "
            f"at {report.rules.confidence:.0%}, at least {runs_for_upper_bound(report.rules.quantile, report.rules.confidence)} "
            "successful runs of the type in the window; each flag says how many, and what window holds them."
        )
    return text


def _names(job_types: Sequence[str]) -> str:
    return ", ".join(f"`{job_type}`" for job_type in job_types)


def deployment_limit_text(report: DurationReport) -> str:
    """The one T2 the deployment's workers apply to every job that the data supports, and what it would cut short."""
    limit = report.deployment_limit
    if limit is None:
        return ""
    text = (
        f"**One T2 for every type**: the deployment's `{DEPLOYMENT_MAX_DURATION_SETTING}`, which its workers' "
        f"`kill_long_job` applies to every job (its Helm chart sets {DEPLOYMENT_CHART_MAX_DURATION_SECONDS} s), judging "
        f"every type against the policy's `max_duration_seconds` ({format_duration(limit.current_seconds)}): "
    )
    if limit.seconds is None:
        return text + f"no value: no type has the {report.rules.min_samples} successful runs a suggestion needs."
    text += (
        f"the data supports **{format_duration(limit.seconds)}** (`{DEPLOYMENT_MAX_DURATION_SETTING}={limit.seconds}`), "
        f"the suggestion for {_names(limit.set_by)}."
    )
    if limit.cut_short:
        parts = [
            f"`{cut.job_type}`{'' if cut.enough_data else ' (not enough data)'}: {cut.successes_longer} of its "
            f"{cut.successes} successful runs"
            for cut in limit.cut_short
        ]
        text += " It would cut short " + "; ".join(parts) + "."
    else:
        text += " It would cut no successful run of the window short."
    if limit.censored:
        text += (
            f" Stopped at {format_duration(limit.current_seconds)} too often to know their tail, so possibly cut short "
            f"still: {_names(limit.censored)}."
        )
    if limit.without_enough_data:
        text += f" Too few runs to tell: {_names(limit.without_enough_data)}."
    return text


def _read_what(report: DurationReport) -> str:
    return "cache entries" if report.source == "cache" else "finished jobs"


def _data_notes(report: DurationReport) -> str:
    notes = [f"Source: {SOURCES.get(report.source, report.source)}."]
    if report.bad_data:
        notes.append(
            "Skipped documents: " + ", ".join(f"{name} {count}" for name, count in report.bad_data.items()) + "."
        )
    if report.missing_days:
        notes.append(
            f"Partial window: it lacks {day_ranges(report.missing_days)}, whose daily tallies were not computed when it "
            f"ran; the figures and the suggestions rest on its other {report.days_present} days."
        )
    return " ".join(notes)


def policy_snippet(report: DurationReport) -> str:
    """Dagster run config for the ``zombie_policy`` resource with the T2 changes, or a comment that there are none.

    The mapping replaces the configured one, so it carries the overrides the changes leave as they are
    (without them, those types would fall back to the default T2); types at the default that keep it are
    left out. Keys are JSON strings: valid YAML whatever the type name holds.
    """
    changes = report.t2_changes()
    if not changes:
        return "# No change: every job type keeps its current T2.\n"
    kept = {
        job_type: seconds
        for job_type, seconds in sorted(report.configured_t2_by_type.items())
        if job_type not in changes
    }
    raised = sum(seconds > report.type_report(job_type).current_t2_seconds for job_type, seconds in changes.items())
    comment = f"# {len(changes)} T2 changes ({raised} raised, {len(changes) - raised} lowered)"
    if kept:
        comment += "; the overrides they leave are kept: the mapping replaces the configured one"
    lines = [comment, "resources:", "  zombie_policy:", "    config:", "      max_duration_seconds_by_type:"]
    for job_type, seconds in sorted(changes.items()):
        entry = report.type_report(job_type)
        lines.append(
            f"        {json.dumps(job_type)}: {seconds}  # {format_duration(seconds)}, {'raised' if entry.change == 'raise' else 'lowered'} from "
            f"{format_duration(entry.current_t2_seconds)}"
        )
    for job_type, seconds in kept.items():
        lines.append(f"        {json.dumps(job_type)}: {seconds}  # {format_duration(seconds)}, configured, kept")
    return "\n".join(lines) + "\n"


def summary_text(report: DurationReport, files: ReportFiles | None = None) -> str:
    """A few plain lines per type, for a terminal: what to change and how sure we are."""
    q = percentile_name(report.rules.quantile)
    lines = [
        f"Job durations, {window_text(report)}: {report.jobs_read} {_read_what(report)}, {counted(report.events_read, 'zombie')} "
        "finalized in the window (the ones of the day running count in tomorrow's)"
    ]
    for entry in report.types:
        counts = (
            ", ".join(f"{count} {status}" for status, count in sorted(entry.statuses.items()) if count) or "no jobs"
        )
        lines.append(f"{entry.job_type}: {counts}; zombie rate {format_share(entry.zombie_rate)}")
        if entry.successes:
            stats = entry.statistics
            lines.append(
                f"    success p50 {format_duration(stats['p50'])}, p99 {format_duration(stats['p99'])}, "
                f"max {format_duration(stats['max'])}"
            )
        if entry.enough_data:
            lines.append(
                f"    T2 {format_duration(entry.current_t2_seconds)} -> {format_duration(entry.suggested_t2_seconds)} "
                f"({entry.change}); {q} {_interval(entry)}; would kill {entry.backtest_successes_stopped} of "
                f"{entry.successes} successes"
                + (
                    f", stop {entry.backtest_stopped_sooner} overruns {format_duration(entry.backtest_seconds_saved)} sooner"
                    if entry.backtest_stopped_sooner
                    else ""
                )
            )
        for flag in entry.flags:
            lines.append(f"    ! {flag}")
    limit = deployment_limit_text(report)
    if limit:
        lines.append(limit.replace("**", "").replace("`", ""))
    if report.late_results:
        lines.append(late_results_text(report).replace("**", "").replace("`", ""))
    if report.causes:
        lines.append(causes_line(report))
    if report.free_runs_spent:
        pairs = ", ".join(f"{row['dataset']} {row['type']}" for row in report.free_runs_spent)
        lines.append(f"free re-runs used up (SIGTERMed alone past them): {pairs}")
    if report.heartbeat is not None:
        lines.extend(heartbeat_summary(report.heartbeat))
    for times in report.detection:
        lines.append(
            f"detection time, {times.reason}: p50 {format_duration(times.p50_seconds)}, p99 "
            f"{format_duration(times.p99_seconds)} ({counted(times.zombies, 'zombie')})"
        )
    notes = _data_notes(report)
    if notes:
        lines.append(notes)
    if files is not None:
        lines.append(
            f"Reports: {files.markdown}, {files.csv}, {files.json}, {files.chart}"
            + (f", {files.gap_chart}" if files.gap_chart is not None else "")
        )
    lines.append("Suggested configuration:")
    lines.extend("  " + line for line in policy_snippet(report).splitlines())
    return "\n".join(lines) + "\n"


def offenders_markdown(found: RepeatOffenders, max_rows: int = 20) -> str:
    """The datasets finalized again and again in a window: a row per dataset and job type, the most finalized first.

    Short enough to read in a report: past ``max_rows`` rows the rest are counted, not listed.
    """
    lines = [
        f"**Repeat offenders {found.window_text()}**: {counted(found.offenders_total, 'dataset')} finalized at least "
        f"{counted(found.threshold, 'time')} ({counted(found.events, 'finalization')} of "
        f"{counted(found.datasets, 'dataset')} in the window).",
        "",
    ]
    rows = found.rows()
    if rows:
        header = [
            "dataset",
            "type",
            "zombies (crashed / never beat / SIGTERM / too long)",
            "first seen",
            "last seen",
            "retry limit reached",
            "last error",
        ]
        table_rows = [
            [
                f"`{row['dataset']}`",
                f"`{row['type']}`",
                f"{row['finalizations']} (" + " / ".join(str(row[reason.value]) for reason in REASONS) + ")",
                row["first_seen"],
                row["last_seen"],
                "quarantined" if row["quarantined"] else "yes" if row["retry_limit_reached"] else "no",
                f"{row['last_error']} ({row['error_from']})",
            ]
            for row in rows[:max_rows]
        ]
        lines += _table(header, table_rows)
        hidden = len(rows) - len(table_rows)
        if hidden or found.truncated:
            lines += [
                "",
                f"Not listed: {hidden} more rows"
                + (f", {found.offenders_total - len(found.offenders)} more datasets" if found.truncated else "")
                + ".",
            ]
    if found.quarantined:
        lines += [
            "",
            f"**Quarantined** at the window's end: {len(found.quarantined)} (dataset, job type) pairs whose workers kept "
            "crashing; their jobs are not re-enqueued until lift_quarantine_job lifts it or it lapses.",
            "",
        ]
        header = ["dataset", "type", "crashes", "within", "since", "lapses at"]
        lines += _table(
            header,
            [
                [
                    f"`{row['dataset']}`",
                    f"`{row['type']}`",
                    str(row["crashes"]),
                    f"{row['window_hours']} h",
                    row["since"],
                    row["lapses_at"],
                ]
                for row in found.quarantined[:max_rows]
            ],
        )
    if found.free_runs_spent:
        lines += ["", *free_runs_lines(found.free_runs_spent, max_rows)]
    if found.malformed:
        lines += [
            "",
            "Skipped events: " + ", ".join(f"{name} {count}" for name, count in sorted(found.malformed.items())) + ".",
        ]
    return "\n".join(lines).rstrip() + "\n"


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return _jsonable(value.item())
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def report_json(report: DurationReport) -> dict[str, Any]:
    """The whole report as plain JSON values."""
    as_json: dict[str, Any] = _jsonable(
        {
            "window_start": report.window_start,
            "window_end": report.window_end,
            "computed_at": report.computed_at,
            "rules": report.rules.as_dict(),
            "heartbeat_timeout_seconds": report.heartbeat_timeout_seconds,
            "default_t2_seconds": report.default_t2_seconds,
            "bad_data": report.bad_data,
            "missing_days": report.missing_days,
            "window_complete": report.complete,
            "days_present": report.days_present,
            "days_expected": report.days_expected,
            "source": report.source,
            "jobs_read": report.jobs_read,
            "events_read": report.events_read,
            "types": [{**record, "flags": entry.flags} for record, entry in zip(report.records(), report.types)],
            "suggested_max_duration_seconds_by_type": report.suggested_max_durations(),
            "t2_changes": report.t2_changes(),
            "zombie_policy_snippet": policy_snippet(report),
            "deployment_max_job_duration": asdict(report.deployment_limit) if report.deployment_limit else None,
            "detection_seconds_by_reason": {times.reason: asdict(times) for times in report.detection},
            "late_results_by_type": report.late_results,
            "finalized_by_type_and_cause": report.causes,
            "free_runs_spent": report.free_runs_spent,
            "heartbeat_timeout": heartbeat_json(report.heartbeat) if report.heartbeat is not None else None,
        }
    )
    return as_json


def report_stem(report: DurationReport) -> str:
    """``durations_<first day>_<last day>``, plus ``_partial-3of7`` when days are missing: a partial window never
    replaces a fuller one. A window of whole days ends at the midnight after its last day, which it does not hold."""
    end = report.window_end
    last = end - dt.timedelta(days=1) if (end.hour, end.minute, end.second, end.microsecond) == (0, 0, 0, 0) else end
    stem = f"durations_{_stamp(report.window_start)}_{_stamp(last)}"
    if not report.complete:
        stem += f"_partial-{report.days_present}of{report.days_expected}"
    return stem


def write_reports(
    report: DurationReport, directory: Path | str | None = None, sections: Sequence[str] = ()
) -> ReportFiles:
    """Write Markdown, CSV, JSON and the chart, named after the window and its completeness; return their paths.

    ``sections`` (Markdown, such as :func:`offenders_markdown`) follow the tables in the Markdown file.
    """
    directory = Path(directory) if directory is not None else config.reports_dir()
    directory.mkdir(parents=True, exist_ok=True)
    stem = report_stem(report)
    gaps = report.heartbeat is not None and bool(report.heartbeat.rows)
    files = ReportFiles(
        csv=directory / f"{stem}.csv",
        json=directory / f"{stem}.json",
        chart=directory / f"{stem}.png",
        markdown=directory / f"{stem}.md",
        gap_chart=directory / f"{stem}_gaps.png" if gaps else None,
    )
    report.statistics_frame().to_csv(files.csv, index=False)
    files.json.write_text(json.dumps(report_json(report), indent=2) + "\n")
    files.markdown.write_text(
        markdown_table(report)
        + "\n```yaml\n"
        + policy_snippet(report)
        + "```\n"
        + "".join("\n" + section for section in sections)
    )
    plot_durations(report, files.chart)
    if report.heartbeat is not None and files.gap_chart is not None:
        plot_gaps(report.heartbeat, window_text(report), files.gap_chart)
    return files


def _stamp(moment: dt.datetime) -> str:
    return f"{moment:%Y-%m-%d}" if (moment.hour, moment.minute) == (0, 0) else f"{moment:%Y-%m-%dT%H%M}"
