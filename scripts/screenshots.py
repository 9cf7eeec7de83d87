#!/usr/bin/env python
"""Regenerate docs/screenshots/*.png: the Dagster UI on simulated data, captured with headless Chromium.

    apt-get install -y chromium          # Debian's package; once
    python scripts/screenshots.py        # about 12 minutes on 2 cores

Everything runs in a temporary directory: its own SecantusDB server, a
simulated deployment as ``zombie-pipeline simulate`` writes it (a week of
history, the seven days before today cleaned daily, with one dataset,
``user42/endless-audio``, crashing its ``/first-rows`` worker every day;
today's zombies beside healthy started jobs), its simulated workers moving the
queue all along (``zombie-pipeline workers``, here with ten times the default
crashes), and ``dagster dev`` with a temporary DAGSTER_HOME on a free port.

The script launches a cleanup given a compensation webhook for every type
(``compensation_webhooks``, the URL in an environment variable) on a local port
nothing listens on, so every compensation fails and ``compensations_succeed``
warns; then ``queue_health`` every few seconds while the workers run, and a
second cleanup, so that its plots show the queue moving; the daily duration
tallies and repeat offenders of the last week and the statistics of yesterday;
and a cleanup launched with a zero heartbeat timeout, which fails in one line.
It captures the pages: plain pages with ``chromium --headless --screenshot``,
the two views the UI shows only in a dialog (the statistics table, the policy
JSON) through Chromium's DevTools protocol, which clicks the link first. It
stops every process it started. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test suite's dagster dev harness and server helper

from tests.e2e import harness  # noqa: E402
from tests.servers import running_server  # noqa: E402
from zombie_pipeline.config import (  # noqa: E402
    CACHE_URL_ENV,
    HOME_ENV,
    KILL_CRON_ENV,
    QUEUE_URL_ENV,
    WEBHOOK_URL_ENV,
)
from zombie_pipeline.defs.tags import CLEANUP_RUN_TAG, PARTITION_TAG  # noqa: E402
from zombie_pipeline.policy import ZombiePolicy  # noqa: E402
from zombie_pipeline.queue.connections import client_for, close_clients  # noqa: E402
from zombie_pipeline.queue.embedded import free_port  # noqa: E402
from zombie_pipeline.queue.generations import (  # noqa: E402
    QUEUE_GENERATIONS,  # noqa: E402
)
from zombie_pipeline.queue.store import Store  # noqa: E402
from zombie_pipeline.simulation.simulator import simulate  # noqa: E402
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates  # noqa: E402
from zombie_pipeline.simulation.workload import Workload, healthy_beside  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
#: As ``zombie-pipeline simulate`` sizes it, with the demo's history: today's queue, the days before cleaned daily.
ZOMBIES = Workload(finished=0)
WORKLOAD = Workload(
    finished=8_000,
    running=healthy_beside(ZOMBIES.zombies, ZombiePolicy()),
    days=8,
    past_cleanups=7,
    seed=0,
)
#: The workers, on a bad day: forty times the default crashes, so that some die, and go stale, within the session.
RATES = WorkerRates(crashes_per_worker_hour=2.0)
STATS_DAYS = 7
#: queue_health materialized this many times, this many seconds apart, while the workers run; a cleanup before the
#: snapshot SECOND_CLEANUP, once the first crashes are older than the heartbeat timeout.
HEALTH_SNAPSHOTS, HEALTH_EVERY_SECONDS, SECOND_CLEANUP = 12, 25, 10
#: Holds the compensation webhook's URL (a closed local port), named in the cleanup's policy.
COMPENSATION_URL_ENV = "SCREENSHOTS_COMPENSATION_URL"
#: What a Launchpad user types by mistake: a cleanup with it fails in its first step, in one line.
BAD_POLICY = {"heartbeat_timeout_seconds": 0}


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("headless Chromium is needed: apt-get install -y chromium")


#: Headless Chromium, offline and quiet: no GPU, no QUIC, no first-run page, no background traffic, no scrollbars.
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def capture(
    browser: str, url: str, path: Path, profile: Path, size: str = "1600,1000", budget_ms: int = 15_000
) -> None:
    """One page; without the virtual time budget the single-page app is captured blank."""
    command = [
        browser,
        *HEADLESS_FLAGS,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        f"--window-size={size}",
        f"--screenshot={path}",
        url,
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=180)
    print(f"  {path}  <- {url}")


class DevTools:
    """Chromium driven over the DevTools protocol, for what needs a click (metadata shown in a dialog)."""

    def __init__(self, browser: str, profile: Path, width: int, height: int) -> None:
        from websockets.sync.client import (
            connect,  # installed with dagster-webserver (uvicorn[standard])
        )

        self.port = free_port()
        self.process = subprocess.Popen(
            [
                browser,
                *HEADLESS_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--remote-debugging-port={self.port}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        targets = harness.wait_for("Chromium's DevTools endpoint", self._targets, 30, 0.3)
        page = next(target["webSocketDebuggerUrl"] for target in targets if target["type"] == "page")
        self.socket = connect(page, max_size=64 * 1024 * 1024)
        self.ids = itertools.count(1)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def _targets(self) -> Any:
        try:
            return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2).read())
        except OSError:
            return None

    def call(self, method: str, **params: Any) -> Any:
        request_id = next(self.ids)
        self.socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == request_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def js(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def dialog(self, url: str, link_text: str, path: Path, nth: int = 0) -> None:
        """Open ``url``, click the ``nth`` link reading ``link_text``, widen the dialog it opens, capture."""
        self.call("Page.navigate", url=url)
        clickable = f"[...document.querySelectorAll('a')].filter(e => e.textContent.trim() === {json.dumps(link_text)})"
        harness.wait_for(f"{link_text!r} on {url}", lambda: (self.js(f"{clickable}.length") or 0) > nth, 60, 0.5)
        self.js(f"{clickable}[{nth}].click()")
        harness.wait_for("the dialog", lambda: self.js("!!document.querySelector('[role=dialog]')"), 15, 0.3)
        self.js(
            "(() => { const d = document.querySelector('[role=dialog]');"
            " d.style.width = (window.innerWidth - 40) + 'px'; d.style.maxWidth = 'none';"
            " for (let n = d; n; n = n.parentElement) n.scrollTop = 0; })()"
        )
        time.sleep(1.0)  # let the layout settle
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print(f"  {path}  <- {url} ({link_text})")

    def clicked(self, url: str, text: str, path: Path, height: int = 1100) -> None:
        """Open ``url``, click the element reading ``text`` (a toggle the URL does not keep), scroll it to the top of
        a window ``height`` pixels high, capture."""
        self.call("Emulation.setDeviceMetricsOverride", width=1600, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=url)
        clickable = f"[...document.querySelectorAll('button, a, [role=button]')].filter(e => e.textContent.trim() === {json.dumps(text)})"
        harness.wait_for(f"{text!r} on {url}", lambda: (self.js(f"{clickable}.length") or 0) > 0, 60, 0.5)
        self.js(f"{clickable}[0].click()")
        time.sleep(4.0)  # the plots load and draw
        self.js(f"{clickable}[0].scrollIntoView({{block: 'start'}})")
        time.sleep(1.0)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        print(f"  {path}  <- {url} ({text})")

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def launch_and_wait(
    dev: harness.DagsterDev, job: str, run_config: dict[str, Any] | None = None, expect: str = "SUCCESS", **options: Any
) -> str:
    run_id = harness.launch(dev, job, run_config or {}, **options)
    status = harness.wait_for_run(dev, run_id, timeout=300)
    print(f"  {job} {options.get('tags', {}).get('dagster/partition', '')} -> {status}")
    if status != expect:
        raise RuntimeError(f"run {run_id} of {job} ended {status}, not {expect}; see {dev.log_path}")
    return run_id


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--keep-open", action="store_true", help="leave the UI up until Enter is pressed")
    args = parser.parse_args()
    browser = chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="zombie-screenshots-") as tmp:
        base = Path(tmp)
        with running_server(base / "server") as server:
            shoot(browser, base, server.url, args)
    return 0


def shoot(browser: str, base: Path, mongo_url: str, args: argparse.Namespace) -> None:
    """Simulate, run the pipeline in ``dagster dev`` on the server at ``mongo_url``, capture the pages."""
    dev = None
    stopping = threading.Event()
    workers = None
    try:
        client = client_for(mongo_url)
        store = Store.of(client["datasets_server_queue"], client["datasets_server_cache"])
        store.ensure_indexes()  # on empty collections: building them later costs ~10 s per index here
        simulation = simulate(store, WORKLOAD)
        print(f"simulated {WORKLOAD.total} jobs, {len(simulation.zombie_ids)} zombies; the past: {simulation.past}")
        pool = WorkerPool(store, QUEUE_GENERATIONS[WORKLOAD.generation], ZombiePolicy(), RATES)
        print(f"{pool.adopt_running()} healthy jobs adopted by the simulated workers")
        workers = threading.Thread(target=pool.run, args=(3_600, stopping.is_set), daemon=True)
        workers.start()
        env = {
            QUEUE_URL_ENV: mongo_url,
            CACHE_URL_ENV: mongo_url,
            HOME_ENV: str(base / "home"),
            KILL_CRON_ENV: "",
            WEBHOOK_URL_ENV: "",
            COMPENSATION_URL_ENV: f"http://127.0.0.1:{free_port()}/undo",  # nothing listens there
            **harness.watcher_off(base),  # the cleanup run shown finds the zombies (a watch run would take them first)
        }
        dev = harness.DagsterDev(base / "dagster_home", free_port(), env).start(timeout=180)
        print(f"dagster dev at {dev.url}")

        webhooks = {"resources": {"zombie_policy": {"config": {"compensation_webhooks": {"*": COMPENSATION_URL_ENV}}}}}
        cleanup_run = launch_and_wait(dev, "kill_zombies_job", webhooks)
        [health] = harness.wait_for(
            "the checks after the cleanup",
            lambda: harness.runs(dev, "queue_health_job", {CLEANUP_RUN_TAG: cleanup_run}),
            120,
            2,
        )
        harness.wait_for_run(dev, health["runId"], timeout=180)
        for snapshot in range(HEALTH_SNAPSHOTS):  # the queue as the workers move it
            time.sleep(HEALTH_EVERY_SECONDS)
            if snapshot == SECOND_CLEANUP:
                launch_and_wait(dev, "kill_zombies_job")
            launch_and_wait(dev, "queue_health_job")
        today = dt.datetime.now(dt.UTC).date()
        days = [(today - dt.timedelta(days=n)).isoformat() for n in range(STATS_DAYS, 0, -1)]
        for day in days:
            launch_and_wait(
                dev,
                "duration_statistics_job",
                tags={PARTITION_TAG: day},
                asset_selection=[["job_duration_tallies"], ["repeat_offenders"]],
            )
        launch_and_wait(
            dev,
            "duration_statistics_job",
            tags={PARTITION_TAG: days[-1]},
            asset_selection=[["job_duration_statistics"]],
        )
        bad = {"resources": {"zombie_policy": {"config": BAD_POLICY}}}
        failed_run = launch_and_wait(dev, "kill_zombies_job", bad, expect="FAILURE")

        profile = base / "chromium"
        pages = {
            "cleanup-run.png": (f"{dev.url}/runs/{cleanup_run}?logs=step%3Asummarize", "1600,1100"),
            "failed-run.png": (f"{dev.url}/runs/{failed_run}?logs=step%3Areconcile", "1600,900"),
            "duration-statistics.png": (f"{dev.url}/assets/job_duration_statistics?view=events", "1600,1300"),
            "queue-health-checks.png": (f"{dev.url}/assets/queue_health?view=checks", "2000,1000"),
            "queue-health.png": (f"{dev.url}/assets/queue_health?view=events", "1600,1300"),
            "repeat-offenders.png": (f"{dev.url}/assets/repeat_offenders?view=checks", "1600,900"),
            "repeat-offenders-table.png": (f"{dev.url}/assets/repeat_offenders?view=events", "2400,1300"),
            "automation.png": (f"{dev.url}/automation", "1600,700"),
        }
        for name, (url, size) in pages.items():
            capture(browser, url, args.out / name, profile, size)
        tools = DevTools(browser, base / "devtools", 1600, 1100)
        try:
            tools.dialog(
                f"{dev.url}/assets/job_duration_statistics?view=events",
                "[Show Markdown]",
                args.out / "duration-statistics-report.png",
            )
            tools.dialog(
                f"{dev.url}/runs/{cleanup_run}?logs=step%3Areconcile", "[Show JSON]", args.out / "cleanup-policy.png"
            )
            tools.clicked(f"{dev.url}/assets/queue_health", "Plots", args.out / "queue-health-plots.png", height=1500)
        finally:
            tools.close()
        if args.keep_open:
            try:
                input(f"UI at {dev.url}; press Enter to stop ")
            except EOFError:
                pass
    finally:
        stopping.set()
        if workers is not None:
            workers.join(timeout=120)
        if dev is not None:
            dev.stop()
        close_clients()


if __name__ == "__main__":
    sys.exit(main())
