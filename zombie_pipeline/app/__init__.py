"""Entry points for people: the ``zombie-pipeline`` command and its demo (they use Dagster; the core does not)."""
