"""How long each job type runs, which maximum duration (T2) the data supports, and which datasets keep crashing.

- :mod:`.tallies`: what a period comes to, per type (exact durations, counts, bad data), and the audited zombies;
- :mod:`.sources`: where a period is read, as the queue's generation says: :mod:`.jobs_source` (finished jobs)
  or :mod:`.cache_source` (cache entries), both on indexes, decoded into columns;
- :mod:`.quantiles`: percentiles, their distribution-free confidence interval, readable rounding;
- :mod:`.analysis`: the suggested T2 of each type with its evidence over a period;
- :mod:`.window`: a window's days, the tallies it takes and what it lacks, and its report (``window_report``: the
  one entry for the asset and a direct read);
- :mod:`.suggestion_log`: the record of suggestions (``zombieT2Suggestions``) the cleanup can opt in to;
- :mod:`.offenders`: the datasets and job types finalized again and again;
- :mod:`.reports`, :mod:`.charts`, :mod:`.formatting`: the report as people read it.

The rules, the sources and every column are described in docs/statistics.md.
No Dagster here: ``defs/statistics/`` wires these into assets.

This package module imports nothing: the code location loads it for the constants below, and a cleanup run, which
loads the whole code location, must not pay for pandas, pyarrow or matplotlib (the modules above import them).
"""

#: Days in a statistics window (the suggestions, the repeat offenders, queue_health's count of them) by default.
DEFAULT_WINDOW_DAYS = 7
