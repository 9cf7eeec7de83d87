"""Dagster jobs: the cleanup, as ops wired around ``zombie_pipeline.cleanup``."""

JOBS: list = []
