"""Benchmarks of zombie-pipeline: cleanup against the 2023 baseline, detection and statistics cost.

Run ``python -m benchmarks.run`` (``--quick`` for a few minutes); see ``docs/benchmarks.md``.
Nothing here is imported by the pipeline itself.
"""
