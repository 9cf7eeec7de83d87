"""How durations and windows read in every report: one spelling for the tables, the charts and the terminal."""

from __future__ import annotations

import math

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


def window_text(report: DurationReport) -> str:
    """The window, and how much of it the figures cover when days are missing."""
    window = f"{report.window_start:%Y-%m-%d %H:%M} – {report.window_end:%Y-%m-%d %H:%M} UTC"
    if not report.complete:
        window += f" (only {report.days_present} of its {report.days_expected} days computed)"
    return window
