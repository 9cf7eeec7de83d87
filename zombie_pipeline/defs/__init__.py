"""The Dagster wiring, one package per domain, each with its jobs, ops, assets, checks, schedules and sensors and its
own ``Definitions``; the resources, tags and metadata helpers every domain shares sit beside them.
``zombie_pipeline.definitions`` merges the domains."""
