"""The detection replay (issues 29, 34, 35): seeds of the production chart's fleet with ground truth, replayed
against the deployment's own killer, the cleanup's sensor runs and the watcher, alone and side by side.

``fleet`` (the chart's pools and autoscaler), ``generate`` (a seed's trace), ``trace`` (jobs, beats, fates),
``rules`` (when a killer's rule holds), ``deployment`` (the killer's passes and costs), ``latency`` (run starts,
ticks, the watcher's lag), ``contenders`` (the event loop), ``database`` (the real cleanup through ``run_cleanup``:
the witness), ``figures`` and ``stats`` (per seed, then over the seeds with bootstrap intervals), ``targets``,
``markdown``, ``section`` (the ``detection`` section of ``python -m benchmarks.run``).
"""
