"""zombie-pipeline: find and finalize zombie jobs in a MongoDB job queue."""

__version__ = "0.1.0"
