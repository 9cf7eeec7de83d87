"""What operators see of the pipeline without opening Dagster: Prometheus figures, failure alerts, webhooks."""
