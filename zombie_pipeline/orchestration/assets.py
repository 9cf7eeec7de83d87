"""Dagster assets: duration statistics and T2 suggestions, wired around ``zombie_pipeline.durations``."""

ASSETS: list = []
