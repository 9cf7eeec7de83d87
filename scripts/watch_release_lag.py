#!/usr/bin/env python
"""The watcher's release lag on the production stack, measured and written to benchmarks/watch_release_lag.json.

The stack of tests/deploy/stack.py (a private PostgreSQL, the code server, ``dagster-daemon``, the default launcher)
with the watcher on, and the fleet of tests/deploy/watch_fleet.py dying at known moments: 24 OOM-killed workers, 6
SIGTERMed, 10 slow ones (beats 0.3 to 0.7 of the timeout apart, never to be released), 20 healthy. Each release is
set against the truth (the beats the workers wrote): the release lag (release - deadline), the detection time (death,
or SIGTERM, to release), what each event recorded. ``--burners N`` runs N CPU-bound processes beside it. The load
average is recorded before and after: the machine may be shared.

    .venv/bin/python scripts/watch_release_lag.py --timeout 60                 # ~7 minutes
    .venv/bin/python scripts/watch_release_lag.py --timeout 60 --burners 4
    .venv/bin/python scripts/watch_release_lag.py --timeout 300                # ~12 minutes: the default policy

Each run replaces its own entry (``timeout<T>_<idle|burnersN>``) in the JSON file and keeps the others.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.deploy.stack import RUN_TIMEOUT, deployment_stack  # noqa: E402
from tests.deploy.watch_fleet import FleetPlan, measure  # noqa: E402
from tests.e2e.harness import wait_for  # noqa: E402
from tests.servers import TEST_URL_ENV, running_server  # noqa: E402
from zombie_pipeline.cleanup import watch_lease  # noqa: E402
from zombie_pipeline.config import POLICY_FILE_ENV  # noqa: E402
from zombie_pipeline.policy import policy_from_file  # noqa: E402
from zombie_pipeline.queue.generations import NEWEST_QUEUE_GENERATION  # noqa: E402
from zombie_pipeline.queue.times import utc_now  # noqa: E402
from zombie_pipeline.simulation.workload import Workload  # noqa: E402

OUTPUT = ROOT / "benchmarks" / "watch_release_lag.json"


def policy_text(timeout: int) -> str:
    """The location's policy: the default one (beats every 60 s, a 120 s grace) at 300 s; beats every 10 s and a 30 s
    grace at a shorter timeout (a beat a minute would be one missed beat)."""
    interval, grace = (60, 120) if timeout >= 300 else (10, 30)
    return (
        f"heartbeat_timeout_seconds: {timeout}\nheartbeat_interval_seconds: {interval}\n"
        f"termination_grace_seconds: {grace}\nqueue_generation: '{NEWEST_QUEUE_GENERATION}'\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=int, default=60, help="the policy's heartbeat timeout, seconds")
    parser.add_argument("--burners", type=int, default=0, help="CPU-bound processes beside the stack")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    arguments = parser.parse_args()
    # deaths farther apart at a longer beat interval: never ten last beats within a minute (a wave, held)
    plan = FleetPlan(death_spacing=9.0 if arguments.timeout < 300 else 12.0, sigterm_spacing=30.0)
    base = Path(tempfile.mkdtemp(prefix="watch-lag-"))
    policy_path = base / "policy.yaml"
    policy_path.write_text(policy_text(arguments.timeout))
    policy = policy_from_file(policy_path)
    workload = Workload(
        finished=20, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=0, waiting=0, days=1.0, seed=34
    )
    with server_url(base) as url, deployment_stack(
        url, base, workload, pipeline_env={POLICY_FILE_ENV: str(policy_path)}, watcher=True,
        before_daemon=lambda ops: ops.stop_sensor("cleanup_checks_sensor"),
    ) as deployment:  # fmt: skip
        wait_for(
            "a watch run to take the lease",
            lambda: watch_lease.alive_watcher(deployment.store.watchers, utc_now()),
            RUN_TIMEOUT,
        )
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(arguments.burners)]
        try:
            measured = measure(deployment.store, policy, plan)
        finally:
            for burner in burners:
                burner.kill()
                burner.wait(timeout=10)
    name = f"timeout{arguments.timeout}_{f'burners{arguments.burners}' if arguments.burners else 'idle'}"
    entry = {
        "conditions": {
            "heartbeat_timeout_seconds": policy.heartbeat_timeout_seconds,
            "heartbeat_interval_seconds": policy.heartbeat_interval_seconds,
            "termination_grace_seconds": policy.termination_grace_seconds,
            "cpu_bound_processes_beside": arguments.burners,
            "cores": os.cpu_count(),
            "load_average_before": measured.load_before,
            "load_average_after": measured.load_after,
            "stack": "tests/deploy/stack.py: PostgreSQL, dagster-daemon, the default run launcher, the embedded server",
            "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip(),
        },
        "summary": measured.summary(),
        "release_lag_samples_seconds": sorted(round(lag, 3) for lag in measured.lags),
        "recorded_release_lag_samples_seconds": sorted(round(lag, 3) for lag in measured.recorded_lags),
        "detection_samples_seconds_by_kind": {
            kind: sorted(round(value, 3) for value in values) for kind, values in measured.detection.items()
        },
    }
    results = json.loads(arguments.output.read_text()) if arguments.output.exists() else {}
    results[name] = entry
    arguments.output.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps({name: entry["summary"]}, indent=1, default=str))
    return 0


def server_url(base: Path):  # type: ignore[no-untyped-def]
    """The MongoDB of ``$ZOMBIE_TEST_MONGO_URL``, else a MongoDB-wire server of the script's own."""
    import contextlib

    url = os.environ.get(TEST_URL_ENV)
    if url:
        return contextlib.nullcontext(url)

    @contextlib.contextmanager
    def started():  # type: ignore[no-untyped-def]
        with running_server(base / "server") as server:
            yield server.url

    return started()


if __name__ == "__main__":
    with pytest.MonkeyPatch.context():
        sys.exit(main())
