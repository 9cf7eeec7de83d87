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

The distribution the detection replay uses (issue 35), in one command the lead can re-run on an idle host:

    .venv/bin/python scripts/cleanup_start.py --distribution [--runs 30] [--hogs 4] [--out benchmarks/replay/start_latency.json]

``--runs`` cleanups queued one after another at idle, then as many beside ``--hogs`` CPU-bound processes (started and
stopped here, by their PIDs), on one stack whose daemon dequeues every ``--dequeue-interval`` s (5, the production
example's ``DAGSTER_DEQUEUE_INTERVAL_SECONDS``; the tests' stack uses 1). Each run's queued-to-started and
queued-to-success are written with the 1-minute load average at its launch: the machine may be shared, so the file
says how busy it was.
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
import time
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
    return [(run["queued_to_started"], run["queued_to_success"]) for run in measured_runs({"idle": runs}, 0)["idle"]]


def measured_runs(
    phases: dict[str, int], hogs: int, dequeue_interval: float | None = None
) -> dict[str, list[dict[str, float]]]:
    """Each phase's cleanups, launched one after another on one stack; the phase named ``loaded`` beside ``hogs``
    CPU-bound processes. Per run: queued to started and to success (Dagster's own timestamps), the load average."""
    workload = Workload(finished=20, crashed=2, never_heartbeated=0, terminated=0, overdue=0, running=10, waiting=0,
                        days=1.0, seed=7)  # fmt: skip
    daemon_env = {"DAGSTER_DEQUEUE_INTERVAL_SECONDS": f"{dequeue_interval:g}"} if dequeue_interval else None
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cleanup-start-") as tmp, running_server(Path(tmp) / "mongo") as server:
        base = Path(tmp) / "stack"
        base.mkdir()
        with deployment_stack(server.url, base, workload, daemon_env=daemon_env,
                              before_daemon=lambda ops: ops.stop_sensor("cleanup_checks_sensor")) as stack:  # fmt: skip
            for phase, runs in phases.items():
                busy = [
                    subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(hogs if phase == "loaded" else 0)
                ]
                try:
                    time.sleep(5.0 if busy else 0.0)  # the hogs at full speed first
                    results[phase] = []
                    for _ in range(runs):
                        load = os.getloadavg()[0]
                        run = stack.ops.launch(CLEANUP)
                        status = stack.wait_for_run(run.run_id)
                        assert status == dg.DagsterRunStatus.SUCCESS, status
                        run_stats = stack.instance.get_run_stats(run.run_id)
                        assert run_stats.enqueued_time and run_stats.start_time and run_stats.end_time
                        results[phase].append({
                            "queued_to_started": round(run_stats.start_time - run_stats.enqueued_time, 3),
                            "queued_to_success": round(run_stats.end_time - run_stats.enqueued_time, 3),
                            "load_average_1m": round(load, 2),
                        })  # fmt: skip
                finally:
                    for process in busy:  # only the processes started here, by their PIDs
                        process.kill()
                        process.wait()
    return results


def distribution(runs: int, hogs: int, dequeue_interval: float, out: Path) -> None:
    """The queued-to-started distribution at idle and beside ``hogs`` CPU-bound processes, written to ``out``."""
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load_before = os.getloadavg()
    phases = measured_runs({"idle": runs, "loaded": runs}, hogs, dequeue_interval)
    document = {
        "what": "cleanup runs on the production stack of the tests (PostgreSQL, dagster-daemon, the default run "
        "launcher, deploy/dagster.yaml), queued one after another as `dagster job launch` queues them: seconds from "
        "queued to started and to success, by Dagster's own timestamps",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started_at": started_at,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
        "load_average_before": [round(value, 2) for value in load_before],
        "dequeue_interval_seconds": dequeue_interval,
        "hogs": hogs,
        "phases": phases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    for phase, measured in phases.items():
        values = sorted(run["queued_to_started"] for run in measured)
        loads = [run["load_average_1m"] for run in measured]
        print(f"{phase}: queued to started median {statistics.median(values):.1f} s, max {values[-1]:.1f} s "
              f"({len(values)} runs; load average {min(loads):.1f}-{max(loads):.1f})")  # fmt: skip
    print(f"written: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=None, help="cleanups launched one after another (default 5; "
                        "30 per phase with --distribution)")  # fmt: skip
    parser.add_argument("--imports", type=int, default=7, help="fresh interpreters importing the location (default 7)")
    parser.add_argument("--distribution", action="store_true", help="the replay's start latencies: idle, then loaded")
    parser.add_argument("--hogs", type=int, default=4, help="CPU-bound processes beside the loaded phase (default 4)")
    parser.add_argument("--dequeue-interval", type=float, default=5.0, help="the daemon's (default 5 s, production's)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "replay" / "start_latency.json")
    options = parser.parse_args()
    if options.distribution:
        distribution(options.runs or 30, options.hogs, options.dequeue_interval, options.out)
        return
    seconds, loaded = import_times(options.imports)
    print(f"import zombie_pipeline.definitions: median {statistics.median(seconds):.2f} s (min {min(seconds):.2f}, "
          f"max {max(seconds):.2f}, {len(seconds)} interpreters); heavy packages loaded: {', '.join(loaded) or 'none'}")  # fmt: skip
    times = cleanup_times(options.runs or 5)
    started, succeeded = [t[0] for t in times], [t[1] for t in times]
    print(
        f"cleanup queued to started: median {statistics.median(started):.1f} s ({', '.join(f'{t:.1f}' for t in started)})"
    )
    print(f"cleanup queued to success: median {statistics.median(succeeded):.1f} s ({', '.join(f'{t:.1f}' for t in succeeded)})")  # fmt: skip


if __name__ == "__main__":
    main()
