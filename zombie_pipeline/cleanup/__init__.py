"""Finding zombies and finalizing each one exactly once, as the queue's generation finishes a job.

``run`` is the one flow (the Dagster ops and ``run_cleanup`` call its steps);
the module docstring of ``run`` tells the whole story of a zombie.
"""
