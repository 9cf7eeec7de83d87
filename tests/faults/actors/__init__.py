"""Programs the fault scenarios run as processes of their own (``python -m tests.faults.actors.<name> ARGS.json``).

Each reads its arguments from a JSON file, says ``started`` (or ``ready``) on its
first line of stdout, and prints its report as the last line, in JSON.
"""
