"""A deployment to try the pipeline on: a simulated queue, simulated workers, and the embedded server they live in."""
