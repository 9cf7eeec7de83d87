"""A real Prometheus Pushgateway for a test: Debian's ``prometheus-pushgateway``, 127.0.0.1, a free port, stopped by PID.

    with running_pushgateway(tmp_path) as gateway:
        ...  # runs push to gateway.url
        gateway.series("zombie_pipeline_started_jobs")  # {labels: value} as Prometheus would scrape them
        gateway.stop()  # the same port refuses connections from then on

Metrics live in memory only (``--persistence.file=`` empty). Where the binary is missing the test is
skipped, saying what to install, except in CI (``$CI`` set), where ``.ci/run`` installs it: there a
missing binary fails the test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.servers import pid_alive
from zombie_pipeline.queue.embedded import free_port

BINARY = "prometheus-pushgateway"
LABELS_ADDED_BY_THE_GATEWAY = ("instance",)


def binary_or_skip(name: str, package: str) -> str:
    """The path of a Debian package's binary; without it, a skip naming the package (a failure in CI)."""
    found = shutil.which(name)
    if found is None:
        message = f"{name} is not installed: apt-get install {package} (.ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class Pushgateway:
    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Pushgateway:
        command = [
            binary_or_skip(BINARY, "prometheus-pushgateway"),
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--persistence.file=",
            "--log.level=warn",
        ]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{BINARY} exited with {self.process.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            with contextlib.suppress(requests.ConnectionError):
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"{BINARY} did not answer on {self.url} within 15 s")

    def stop(self) -> None:
        """SIGTERM to its PID, SIGKILL after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def scrape(self) -> str:
        """``/metrics`` as Prometheus scrapes it."""
        response = requests.get(f"{self.url}/metrics", timeout=5)
        response.raise_for_status()
        return response.text

    def series(self, name: str, **match: str) -> dict[tuple[tuple[str, str], ...], float]:
        """The samples named ``name`` (whose labels include ``match``), keyed by their labels, the gateway's own left out."""
        found = {}
        for family in text_string_to_metric_families(self.scrape()):
            for sample in family.samples:
                if sample.name != name or any(sample.labels.get(key) != value for key, value in match.items()):
                    continue
                labels = {key: value for key, value in sample.labels.items() if key not in LABELS_ADDED_BY_THE_GATEWAY}
                found[tuple(sorted(labels.items()))] = sample.value
        return found


@contextlib.contextmanager
def running_pushgateway(base: Path) -> Iterator[Pushgateway]:
    gateway = Pushgateway(base / "pushgateway.log")
    try:
        yield gateway.start()
    finally:
        gateway.stop()
        if gateway.process is not None:
            assert not pid_alive(gateway.process.pid), f"{BINARY} (PID {gateway.process.pid}) outlived its test"
