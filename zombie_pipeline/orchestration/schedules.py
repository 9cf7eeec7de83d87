"""Schedules of the pipeline."""

SCHEDULES: list = []
