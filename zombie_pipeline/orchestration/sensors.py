"""Sensors of the pipeline."""

SENSORS: list = []
