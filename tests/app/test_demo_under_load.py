"""The quick start on a busy laptop: ``zombie-pipeline demo`` ten times in a row, each in a fresh home, beside four
CPU-bound processes on this machine's cores. Every one succeeds: a test of behaviour under load, not of time.

Each demo is the console script a new user runs, in a project home of its own (so it starts its own embedded
server, stopped by its PID afterwards); the busy processes are started and killed by the test, by their PIDs.
Minutes: marker ``load``, run by ``.ci/run``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.app.test_cli import CLI
from tests.figures import report_figures
from tests.servers import child_env, kill_recorded_server, pid_alive, wait_until_gone

pytestmark = pytest.mark.load

DEMOS = 10
BUSY_PROCESSES = 4


def test_ten_demos_in_fresh_homes_beside_four_cpu_bound_processes_all_succeed(tmp_path):
    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)
        for _ in range(BUSY_PROCESSES)
    ]
    outcomes: list[dict[str, Any]] = []
    try:
        time.sleep(3)  # the load is there before the first demo starts
        for number in range(DEMOS):
            home = tmp_path / f"home-{number}"
            started = time.monotonic()
            try:
                demo = subprocess.run([*CLI, "demo"], env=child_env(home), capture_output=True, text=True, timeout=900)
            finally:
                kill_recorded_server(home)
            seconds = round(time.monotonic() - started, 1)
            outcomes.append(
                {
                    "demo": number,
                    "returncode": demo.returncode,
                    "seconds": seconds,
                    "load_average_1min": round(os.getloadavg()[0], 1),
                    "cleanup": next((line for line in demo.stdout.splitlines() if "kill_zombies_job:" in line), ""),
                    "error": demo.stderr.strip().splitlines()[-1:] if demo.returncode else [],
                }
            )
            assert all(pid_alive(process.pid) for process in busy)  # still busy all along
    finally:
        for process in busy:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    report_figures("demo_under_load", {"busy_processes": BUSY_PROCESSES, "cores": os.cpu_count(), "demos": outcomes})

    assert all(wait_until_gone(process.pid) for process in busy)
    failed = [outcome for outcome in outcomes if outcome["returncode"] != 0 or "succeeded" not in outcome["cleanup"]]
    assert failed == [], failed
    assert len(outcomes) == DEMOS
