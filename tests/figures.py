"""The figures the reliability scenarios print (and collect, for docs/reliability.md)."""

import json
import os
from typing import Any

FIGURES_FILE_ENV = "ZOMBIE_FIGURES_FILE"


def report_figures(scenario: str, figures: dict[str, Any]) -> None:
    """A ``FIGURES {...}`` line on stdout (seen with ``pytest -s``), appended to $ZOMBIE_FIGURES_FILE if set."""
    line = json.dumps({"scenario": scenario, **figures}, default=str)
    print(f"\nFIGURES {line}")
    path = os.environ.get(FIGURES_FILE_ENV)
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")
