"""How long each job type runs, and which maximum duration (T2) the data supports.

- :mod:`.tallies`: a period's finished jobs and audited zombies, read on indexes
  and folded into per-type tallies of exact durations;
- :mod:`.quantiles`: percentiles, their distribution-free confidence interval, and
  the rounding of a suggestion to a value an operator reads at a glance;
- :mod:`.suggest`: the suggested T2 of each type with its evidence (backtest,
  censoring) over a window, as a :class:`~.suggest.DurationReport`;
- :mod:`.suggestions`: the record of suggestions the cleanup can opt in to;
- :mod:`.reports`: the report as people read it (Markdown, CSV, JSON, chart).

The rules, the sources and every column are described in docs/statistics.md.
No Dagster here: ``orchestration/statistics.py`` wires these into assets.
"""
