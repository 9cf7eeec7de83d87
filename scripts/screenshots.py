#!/usr/bin/env python
"""Regenerate docs/screenshots/*.png: the Dagster UI on simulated data, captured with headless Chromium.

    apt-get install -y chromium          # Debian's package; once
    python scripts/screenshots.py        # 2.5 minutes on 2 cores

Everything runs in a temporary directory: its own SecantusDB server, a
simulated queue (a week of history and zombies), ``dagster dev`` with a
temporary DAGSTER_HOME on a free port.

A repeat offender is made the way one happens: one dataset's ``/first-rows``
job crashes its worker on each of the last three days, and each day the
cleanup (``cleanup.run_cleanup``, in this process, its clock set to that day)
finalizes it and enqueues its retry, which the next day's worker takes and
crashes on again. Today's retry crashes too, and the cleanup in ``dagster dev``
finalizes it with the simulated zombies, its retry limit reached. That cleanup
is given a compensation webhook for every type (``compensation_webhooks``, the
URL in an environment variable) on a local port nothing listens on, so every
compensation fails and ``compensations_succeed`` warns.

The script launches that cleanup, the daily duration tallies and repeat
offenders of the last week and the statistics of yesterday, waits for the
checks that follow the cleanup, then captures the pages:
plain pages with ``chromium --headless --screenshot``, the two views the UI
shows only in a dialog (the statistics table, the policy JSON) through
Chromium's DevTools protocol, which clicks the link first. It stops every
process it started. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the test suite's dagster dev harness and server helper

from tests.e2e import harness  # noqa: E402
from tests.servers import running_server  # noqa: E402
from zombie_pipeline.cleanup.run import run_cleanup  # noqa: E402
from zombie_pipeline.config import (  # noqa: E402
    CACHE_URL_ENV,
    HOME_ENV,
    KILL_CRON_ENV,
    QUEUE_URL_ENV,
    WEBHOOK_URL_ENV,
)
from zombie_pipeline.orchestration.tags import CLEANUP_RUN_TAG, PARTITION_TAG  # noqa: E402
from zombie_pipeline.policy import ZombiePolicy  # noqa: E402
from zombie_pipeline.queue import documents  # noqa: E402
from zombie_pipeline.queue.connections import client_for, close_clients  # noqa: E402
from zombie_pipeline.queue.documents import ID, Job, Status, truncate_ms  # noqa: E402
from zombie_pipeline.queue.generations import NEWEST_CACHE_GENERATION, OLDEST_QUEUE_GENERATION  # noqa: E402
from zombie_pipeline.queue.store import Store  # noqa: E402
from zombie_pipeline.simulation.embedded import free_port  # noqa: E402
from zombie_pipeline.simulation.simulator import Workload, job_document, simulate  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
#: An early-2023 queue (finished jobs kept with their status), as the screenshots in docs/ show.
WORKLOAD = Workload(
    finished=4_000,
    crashed=24,
    never_heartbeated=6,
    overdue=6,
    running=60,
    waiting=40,
    days=8,
    seed=0,
    generation=OLDEST_QUEUE_GENERATION,
    cache_generation=NEWEST_CACHE_GENERATION,
)
STATS_DAYS = 7
#: The dataset whose job crashes its worker every day: a repeat offender (3 finalizations reach the threshold).
OFFENDER = {"job_type": "/first-rows", "dataset": "user42/endless-audio", "config": "default", "split": "train"}
#: When its worker died on each past day: days ago, hour (UTC).
OFFENDER_CRASHES = ((3, 9.5), (2, 14.0), (1, 21.25))
#: Holds the compensation webhook's URL (a closed local port), named in the cleanup's policy.
COMPENSATION_URL_ENV = "SCREENSHOTS_COMPENSATION_URL"


@contextlib.contextmanager
def clock_at(moment: dt.datetime):
    """The pipeline's clock set to ``moment``: ``documents.utc_now``, wherever a module imported it by name."""
    modules = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("zombie_pipeline") and getattr(module, "utc_now", None) is documents.utc_now
    ]
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(mock.patch.object(module, "utc_now", lambda: moment))
        yield


def crash_offender(store: Store, at: dt.datetime) -> None:
    """A worker takes the offending job (its waiting retry, else a new job) and dies: silent for 10 minutes at ``at``."""
    started, beat = truncate_ms(at - dt.timedelta(minutes=15)), truncate_ms(at - dt.timedelta(minutes=10))
    query = {Job.TYPE: OFFENDER["job_type"], Job.DATASET: OFFENDER["dataset"], Job.STATUS: Status.WAITING}
    waiting = store.jobs.find_one(query)
    if waiting is not None:
        store.jobs.update_one(
            {ID: waiting[ID], Job.STATUS: Status.WAITING},
            {"$set": {Job.STATUS: Status.STARTED, Job.STARTED_AT: started, Job.LAST_HEARTBEAT: beat}},
        )
    else:
        store.jobs.insert_one(
            job_document(
                status=Status.STARTED,
                generation=WORKLOAD.generation,
                created_at=started - dt.timedelta(minutes=2),
                started_at=started,
                last_heartbeat=beat,
                **OFFENDER,
            )
        )


def offender_history(store: Store, today: dt.date) -> None:
    """The past days' cleanups of the offender: the real cleanup, its clock set to each day."""
    midnight = dt.datetime.combine(today, dt.time(), dt.UTC)
    for days_ago, hour in OFFENDER_CRASHES:
        at = truncate_ms(midnight - dt.timedelta(days=days_ago) + dt.timedelta(hours=hour))
        crash_offender(store, at)
        with clock_at(at):
            report = run_cleanup(
                store, ZombiePolicy(), f"screenshots-history-{at:%Y%m%d}", now=at, job_types=[OFFENDER["job_type"]]
            )
        print(f"  cleanup at {at:%Y-%m-%d %H:%M} UTC: {dict(report.counts)}")


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("headless Chromium is needed: apt-get install -y chromium")


def capture(
    browser: str, url: str, path: Path, profile: Path, size: str = "1600,1000", budget_ms: int = 15_000
) -> None:
    """One page; without the virtual time budget the single-page app is captured blank."""
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
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
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
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

    def _targets(self):
        try:
            return json.loads(urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2).read())
        except OSError:
            return None

    def call(self, method: str, **params):
        request_id = next(self.ids)
        self.socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == request_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def js(self, expression: str):
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

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def launch_and_wait(dev: harness.DagsterDev, job: str, run_config: dict | None = None, **options) -> str:
    run_id = harness.launch(dev, job, run_config or {}, **options)
    status = harness.wait_for_run(dev, run_id, timeout=300)
    print(f"  {job} {options.get('tags', {}).get('dagster/partition', '')} -> {status}")
    if status != "SUCCESS":
        raise RuntimeError(f"run {run_id} of {job} ended {status}; see {dev.log_path}")
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
    try:
        client = client_for(mongo_url)
        store = Store.of(client["datasets_server_queue"], client["datasets_server_cache"])
        store.ensure_indexes()  # on empty collections: building them later costs ~10 s per index here
        simulation = simulate(store, WORKLOAD)
        print(f"simulated {WORKLOAD.total} jobs, {len(simulation.zombie_ids)} zombies")
        today = dt.datetime.now(dt.UTC).date()
        offender_history(store, today)
        crash_offender(store, documents.utc_now())  # today's retry dies too: the cleanup below finalizes it
        env = {
            QUEUE_URL_ENV: mongo_url,
            CACHE_URL_ENV: mongo_url,
            HOME_ENV: str(base / "home"),
            KILL_CRON_ENV: "",
            WEBHOOK_URL_ENV: "",
            COMPENSATION_URL_ENV: f"http://127.0.0.1:{free_port()}/undo",  # nothing listens there
        }
        dev = harness.DagsterDev(base / "dagster_home", free_port(), env).start(timeout=180)
        print(f"dagster dev at {dev.url}")

        webhooks = {"resources": {"zombie_policy": {"config": {"compensation_webhooks": {"*": COMPENSATION_URL_ENV}}}}}
        cleanup_run = launch_and_wait(dev, "kill_zombies_job", webhooks)
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
        [health] = harness.wait_for(
            "the checks after the cleanup",
            lambda: harness.runs(dev, "queue_health_job", {CLEANUP_RUN_TAG: cleanup_run}),
            120,
            2,
        )
        harness.wait_for_run(dev, health["runId"], timeout=180)

        profile = base / "chromium"
        pages = {
            "cleanup-run.png": (f"{dev.url}/runs/{cleanup_run}?logs=step%3Asummarize", "1600,1100"),
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
        finally:
            tools.close()
        if args.keep_open:
            try:
                input(f"UI at {dev.url}; press Enter to stop ")
            except EOFError:
                pass
    finally:
        if dev is not None:
            dev.stop()
        close_clients()


if __name__ == "__main__":
    sys.exit(main())
