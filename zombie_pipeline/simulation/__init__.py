"""A deployment to try the pipeline on: a simulated queue and its simulated workers."""
