"""What operators see of the pipeline without opening Dagster: the queue's state the sensors and checks read, Prometheus
figures, failure alerts, webhooks."""
