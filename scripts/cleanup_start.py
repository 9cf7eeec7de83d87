"""How fast a cleanup run starts: the code location's import, and a cleanup from queued to success on the production stack.

    .venv/bin/python scripts/cleanup_start.py [--runs 5] [--imports 7]

Every run's worker starts by loading the whole code location (``zombie_pipeline.definitions``), so what that import
costs, a cleanup pays before its first step. Two measures:

- the import, in a fresh interpreter each time: ``python -X importtime -c "import zombie_pipeline.definitions"``, its
  cumulative time (median of ``--imports``), and which of the statistics' heavy packages it loaded;
- ``--runs`` cleanups, one after another, on the deployment of tests/deploy/stack.py (a private PostgreSQL,
  ``dagster code-server start`` as the image runs it, ``dagster-daemon run``, deploy/dagster.yaml; a MongoDB-wire
  server of its own with a small simulated queue), each queued as ``dagster job launch`` queues it: from queued to
  started and to success, by Dagster's own timestamps (the enqueue event, the run's start and end).

It measures the checkout it is in (tests/deploy runs the code server from it). To compare with another commit, run the
same script from an export of that commit (``git archive COMMIT | tar -x -C DIR``; copy this script there if the
commit lacks it) with ``PYTHONPATH=DIR``. Figures in docs/deploy.md, section 6.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the production stack of the test suite, and this checkout's code

import dagster as dg  # noqa: E402

from tests.deploy.stack import CLEANUP, deployment_stack  # noqa: E402
from tests.servers import running_server  # noqa: E402
from zombie_pipeline.simulation.workload import Workload  # noqa: E402

HEAVY = ("pandas", "pyarrow", "pymongoarrow", "matplotlib", "scipy", "numpy")
PROBE = (
    "import json, sys, zombie_pipeline.definitions; "
    f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
)


def import_times(count: int) -> tuple[list[float], list[str]]:
    """The cumulative import time of zombie_pipeline.definitions in ``count`` fresh interpreters; the heavy packages."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    seconds, loaded = [], []
    for _ in range(count):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", PROBE], cwd=ROOT, env=env, capture_output=True,
                              text=True, check=True)  # fmt: skip
        found = re.search(r"\|\s+(\d+) \| zombie_pipeline\.definitions$", done.stderr, re.MULTILINE)
        assert found, done.stderr[-2000:]
        seconds.append(int(found.group(1)) / 1e6)
        loaded = json.loads(done.stdout)
    return seconds, loaded


def cleanup_times(runs: int) -> list[tuple[float, float]]:
    """(queued to started, queued to success) of ``runs`` cleanups launched one after another."""
    workload = Workload(finished=20, crashed=2, never_heartbeated=0, terminated=0, overdue=0, running=10, waiting=0,
                        days=1.0, seed=7)  # fmt: skip
    times = []
    with tempfile.TemporaryDirectory(prefix="cleanup-start-") as tmp, running_server(Path(tmp) / "mongo") as server:
        base = Path(tmp) / "stack"
        base.mkdir()
        with deployment_stack(server.url, base, workload, before_daemon=lambda ops: ops.stop_sensor("cleanup_checks_sensor")) as stack:  # fmt: skip
            for _ in range(runs):
                run = stack.ops.launch(CLEANUP)
                status = stack.wait_for_run(run.run_id)
                assert status == dg.DagsterRunStatus.SUCCESS, status
                run_stats = stack.instance.get_run_stats(run.run_id)
                assert run_stats.enqueued_time and run_stats.start_time and run_stats.end_time
                times.append(
                    (run_stats.start_time - run_stats.enqueued_time, run_stats.end_time - run_stats.enqueued_time)
                )
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="cleanups launched one after another (default 5)")
    parser.add_argument("--imports", type=int, default=7, help="fresh interpreters importing the location (default 7)")
    options = parser.parse_args()
    seconds, loaded = import_times(options.imports)
    print(f"import zombie_pipeline.definitions: median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, "
          f"max {max(seconds):.2f}, {len(seconds)} interpreters); heavy packages loaded: {', '.join(loaded) or 'none'}")  # fmt: skip
    times = cleanup_times(options.runs)
    started, succeeded = [t[0] for t in times], [t[1] for t in times]
    print(
        f"cleanup queued to started: median {statistics.median(started):.1f} s ({', '.join(f'{t:.1f}' for t in started)})"
    )
    print(f"cleanup queued to success: median {statistics.median(succeeded):.1f} s ({', '.join(f'{t:.1f}' for t in succeeded)})")  # fmt: skip


if __name__ == "__main__":
    main()
