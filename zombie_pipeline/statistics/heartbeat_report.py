"""The heartbeat timeout suggestion as people read it: a Markdown section, a policy snippet, JSON, terminal lines.

Nothing here reads the database; :mod:`.reports` puts these into the statistics report's files.
"""

from __future__ import annotations

from typing import Any

from zombie_pipeline.statistics.formatting import format_duration, format_rare_share, table_lines
from zombie_pipeline.statistics.heartbeat_timeout import Candidate, GapRow, HeartbeatTimeoutSuggestion
from zombie_pipeline.statistics.quantiles import percentile_name


def _seconds(seconds: float | None) -> str:
    return format_duration(seconds) if seconds is not None else "–"


def _current_text(suggestion: HeartbeatTimeoutSuggestion) -> str:
    text = f"current {format_duration(suggestion.current_seconds)}"
    if suggestion.deployment_seconds is not None:
        text += (
            f", the deployment's own {suggestion.deployment_seconds // suggestion.interval_seconds} × "
            f"{format_duration(suggestion.interval_seconds)} = {format_duration(suggestion.deployment_seconds)}"
        )
    return text


def _row(row: GapRow) -> list[str]:
    gaps, finished = row.tally.gaps, row.tally.finished
    ends = f"{row.tally.finalized} / {row.tally.ended_unseen} / {row.tally.partly_watched}"
    return [
        row.name,
        f"{row.gaps:,}",
        _seconds(gaps.quantile(0.5)),
        _seconds(gaps.quantile(0.99)),
        _seconds(gaps.longest if row.gaps else None),
        _seconds(row.bound) if row.bound is not None else "too few gaps",
        _seconds(row.need),
        f"{finished.count:,}" + (f" (longest {format_duration(finished.longest)})" if finished.count else ""),
        ends,
    ]


def _candidate(candidate: Candidate, suggestion: HeartbeatTimeoutSuggestion) -> list[str]:
    marks = [
        mark
        for mark, seconds in (
            ("current", suggestion.current_seconds),
            ("suggested", suggestion.suggested_seconds),
            ("deployment's", suggestion.deployment_seconds),
        )
        if seconds == candidate.seconds
    ]
    sooner = candidate.saved_per_death
    return [
        format_duration(candidate.seconds) + (f" ({', '.join(marks)})" if marks else ""),
        f"{candidate.gaps_longer:,} ({format_rare_share(candidate.gap_share)})",
        f"{candidate.finished_longer:,} ({format_rare_share(candidate.finished_share)})",
        f"{candidate.worst_row} {format_rare_share(candidate.worst_share)}" if candidate.worst_row else "–",
        ("–" if sooner == 0 else format_duration(abs(sooner)) + (" sooner" if sooner > 0 else " later")),
        "below the deployment's" if candidate.below_deployment else "",
    ]


def heartbeat_markdown(suggestion: HeartbeatTimeoutSuggestion) -> list[str]:
    """The report's section: the gaps per job type and worker size, each candidate's mistakes and gain, the flags."""
    rules = suggestion.rules
    q = percentile_name(rules.quantile)
    if suggestion.lowering:
        verdict = f"suggested **{format_duration(suggestion.suggested_seconds)}** (lower)"
    else:
        verdict = f"kept at {format_duration(suggestion.current_seconds)}"
    lines = [
        f"**Heartbeat timeout** ({_current_text(suggestion)}): {verdict}. From {suggestion.gaps:,} gaps between the "
        f"signs of life of live jobs (docs/statistics.md, Heartbeat timeout): the {q}'s upper bound at "
        f"{rules.confidence:.0%} × {rules.margin:g}, rounded up, at least {rules.min_intervals} heartbeat intervals; "
        "only ever lower than the timeout in force, whose longer gaps are never seen complete.",
        "",
    ]
    if suggestion.rows:
        header = [
            "type",
            "gaps",
            "p50",
            "p99",
            "longest",
            f"{q} bound",
            "needs",
            "finished",
            "finalized / unseen / in part",
        ]
        lines += [*table_lines(header, [_row(row) for row in suggestion.rows]), ""]
        header = ["timeout", "gaps longer", "finished jobs cut short", "worst", "each death found", ""]
        rows = [_candidate(candidate, suggestion) for candidate in suggestion.candidates]
        lines += [*table_lines(header, rows), ""]
    lines += [f"- {flag}" for flag in suggestion.flags]
    return [*lines, "", "```yaml", *heartbeat_snippet(suggestion).splitlines(), "```"]


def heartbeat_snippet(suggestion: HeartbeatTimeoutSuggestion) -> str:
    """Run config for the ``zombie_policy`` resource with the suggested timeout, or a comment that it stays."""
    if not suggestion.lowering:
        return f"# No change: the heartbeat timeout stays at {format_duration(suggestion.current_seconds)}.\n"
    comment = (
        f"{format_duration(suggestion.suggested_seconds)}, lowered from {format_duration(suggestion.current_seconds)}"
    )
    if suggestion.below_deployment and suggestion.deployment_seconds is not None:
        comment += f"; below the deployment's own {format_duration(suggestion.deployment_seconds)}"
    return (
        "resources:\n  zombie_policy:\n    config:\n"
        f"      heartbeat_timeout_seconds: {suggestion.suggested_seconds}  # {comment}\n"
    )


def heartbeat_json(suggestion: HeartbeatTimeoutSuggestion) -> dict[str, Any]:
    """The suggestion and its evidence as plain values."""
    return {
        "current_seconds": suggestion.current_seconds,
        "suggested_seconds": suggestion.suggested_seconds,
        "supported_seconds": suggestion.point,
        "set_by": suggestion.set_by,
        "deployment_seconds": suggestion.deployment_seconds,
        "below_deployment": suggestion.below_deployment,
        "rules": {
            "quantile": suggestion.rules.quantile,
            "confidence": suggestion.rules.confidence,
            "margin": suggestion.rules.margin,
            "min_intervals": suggestion.rules.min_intervals,
        },
        "gaps": suggestion.gaps,
        "deaths": suggestion.deaths,
        "rows": [
            {
                "type": row.job_type,
                "worker": row.worker,
                "gaps": row.gaps,
                "p50_seconds": row.tally.gaps.quantile(0.5),
                "p99_seconds": row.tally.gaps.quantile(0.99),
                "longest_seconds": row.tally.gaps.longest if row.gaps else None,
                "bound_seconds": row.bound,
                "needs_seconds": row.need,
                "finished": row.tally.finished.count,
                "longest_finished_silence_seconds": row.tally.finished.longest if row.tally.finished.count else None,
                "finished_partly_watched": row.tally.partly_watched,
                "finalized": row.tally.finalized,
                "ended_unseen": row.tally.ended_unseen,
                "unobserved": row.tally.unobserved,
            }
            for row in suggestion.rows
        ],
        "candidates": [
            {
                "seconds": candidate.seconds,
                "gaps_longer": candidate.gaps_longer,
                "gap_share": candidate.gap_share,
                "finished_longer": candidate.finished_longer,
                "finished_share": candidate.finished_share,
                "saved_per_death_seconds": candidate.saved_per_death,
                "saved_seconds": candidate.saved_seconds,
                "below_deployment": candidate.below_deployment,
            }
            for candidate in suggestion.candidates
        ],
        "flags": suggestion.flags,
        "snippet": heartbeat_snippet(suggestion),
    }


def heartbeat_summary(suggestion: HeartbeatTimeoutSuggestion) -> list[str]:
    """A few terminal lines: the verdict and its flags."""
    if not suggestion.rows:
        return [f"heartbeat timeout {format_duration(suggestion.current_seconds)} kept: {suggestion.flags[0]}"]
    change = "lower" if suggestion.lowering else "keep"
    lines = [
        f"heartbeat timeout {format_duration(suggestion.current_seconds)} -> "
        f"{format_duration(suggestion.suggested_seconds)} ({change}), from {suggestion.gaps:,} gaps of "
        f"{len(suggestion.rows)} job types and worker sizes"
    ]
    return lines + [f"    ! {flag.replace('`', '')}" for flag in suggestion.flags]
