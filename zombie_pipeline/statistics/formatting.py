"""How durations and windows read in every report: one spelling for the tables, the charts and the terminal."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for annotations only: the analysis imports format_duration for its flags
    from zombie_pipeline.statistics.analysis import DurationReport


def format_duration(seconds: float | None) -> str:
    """``42.1 s``, ``20 min``, ``1 h 15 min``: the units an operator thinks a timeout in."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "–"
    if seconds < 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3_600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min" if rest == 0 else f"{minutes} min {rest} s"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"


def format_share(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def format_rare_share(value: float | None) -> str:
    """A share however small: ``0.019%`` rather than ``0.0%`` (a good timeout's mistakes are rare); ``0%`` is none."""
    if value is None:
        return "–"
    if value == 0 or value >= 0.1:
        return f"{value:.0%}"
    return f"{100 * value:.2g}%"


def window_text(report: DurationReport) -> str:
    """The window and whether its figures cover all of it: in a backfill, which reports are the complete ones."""
    window = f"{report.window_start:%Y-%m-%d %H:%M} – {report.window_end:%Y-%m-%d %H:%M} UTC"
    if report.complete:
        return window + f" (complete: {_days(report.days_expected)})"
    return window + (
        f" (partial: {report.days_present} of its {_days(report.days_expected)}; lacks {day_ranges(report.missing_days)})"
    )


def _days(count: int) -> str:
    return f"{count} day" if count == 1 else f"{count} days"


def day_ranges(days: Sequence[str]) -> str:
    """``2024-03-01 – 2024-03-03, 2024-03-05``: ISO days, runs of consecutive ones written as their first and last."""
    dates = sorted(dt.date.fromisoformat(day) for day in days)
    runs: list[list[dt.date]] = []
    for date in dates:
        if runs and date - runs[-1][-1] == dt.timedelta(days=1):
            runs[-1].append(date)
        else:
            runs.append([date])
    return ", ".join(f"{run[0]}" if len(run) == 1 else f"{run[0]} – {run[-1]}" for run in runs)


def table_lines(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table: its header, rule and rows, a cell's pipes escaped and its line breaks made spaces."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(_cell(value) for value in row) + " |" for row in rows),
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
