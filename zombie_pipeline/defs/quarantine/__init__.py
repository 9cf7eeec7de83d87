"""Lifting a quarantine by hand: ``lift_quarantine_job``."""

import dagster as dg

from zombie_pipeline.defs.quarantine.jobs import lift_quarantine_job

defs = dg.Definitions(jobs=[lift_quarantine_job])
