"""A fresh server for every run, the same data in each, behind an injected round-trip time.

A long-lived embedded server slows down as it absorbs writes (the first
benchmark saw the baseline's single writes take 2-3x longer late in a run), so
each measured run gets a server of its own:

* **embedded** (no URL): the case's data is written once into a SecantusDB
  started here, which is then stopped; that storage directory is the case's
  *template*. Each run copies the template, starts a server on the copy (on a
  free port of 127.0.0.1), runs, and stops it by its PID. Every run starts
  from the same bytes on a server that has done nothing else.
* **external** (``QUEUE_MONGO_URL`` or ``--url``): the server cannot be
  restarted from here, so each run gets fresh databases instead: they are
  dropped and the case is built again (the simulator is seeded and given the
  same ``now``), outside the timed part.

:func:`delay_proxy` puts :mod:`benchmarks.proxy` (its own process) between the
client and the server; :func:`round_trip_ms` measures what a ``ping`` then
costs, so the model is fitted on measured round trips, not on the setting.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from benchmarks.harness import new_client

PROXY_SCRIPT = Path(__file__).with_name("proxy.py")


# --- the delay proxy --------------------------------------------------------------------------


@contextlib.contextmanager
def delay_proxy(target: tuple[str, int], delay_ms: float) -> Iterator[tuple[int, int]]:
    """Start the proxy in front of ``target``; yield (its port, its PID); stop it by its PID."""
    process = subprocess.Popen(
        [sys.executable, str(PROXY_SCRIPT), "--target", f"{target[0]}:{target[1]}", "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline() if process.stdout else ""
        match = re.match(r"listening [\d.]+:(\d+)", line)
        if not match:
            raise RuntimeError(f"the delay proxy did not start (said {line!r}, exit code {process.poll()})")
        yield int(match.group(1)), process.pid
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if process.stdout:
            process.stdout.close()


_HOST_URL = re.compile(r"^mongodb://(?P<auth>[^@/]*@)?(?P<host>[^/,?:]+)(?::(?P<port>\d+))?(?P<rest>/.*)?$")


def single_host(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of a one-host ``mongodb://`` URL; None for a seed list or ``mongodb+srv://``."""
    match = _HOST_URL.match(url)
    if not match:
        return None
    return match.group("host"), int(match.group("port") or 27017)


def via(url: str, port: int) -> str:
    """``url`` pointed at the proxy on 127.0.0.1:``port``, credentials and options kept, connected directly."""
    match = _HOST_URL.match(url)
    if not match:
        raise ValueError("only a one-host mongodb:// URL can go through the delay proxy")
    rest = match.group("rest") or "/"
    if "directConnection" not in rest:
        rest += ("&" if "?" in rest else ("?" if rest.endswith("/") else "/?")) + "directConnection=true"
    return f"mongodb://{match.group('auth') or ''}127.0.0.1:{port}{rest}"


def round_trip_ms(url: str, pings: int = 60) -> float:
    """Median milliseconds of a ``ping`` on an open connection."""
    client = new_client(url)
    try:
        client.admin.command("ping")
        samples = []
        for _ in range(pings):
            started = time.perf_counter()
            client.admin.command("ping")
            samples.append((time.perf_counter() - started) * 1000)
        return round(statistics.median(samples), 3)
    finally:
        client.close()


# --- templates and fresh servers --------------------------------------------------------------


@dataclass
class Template:
    """A case's data: a stopped server's storage (embedded), or how to build it again (external)."""

    name: str
    queue_db: str
    cache_db: str
    build: Callable[[MongoClient, str, str], dict[str, Any]]
    facts: dict[str, Any] = field(default_factory=dict)  # what building it said: now, zombies, started jobs...
    storage: Path | None = None  # embedded only
    build_seconds: float = 0.0
    pristine: bool = True  # external: the databases are as built, no run has touched them yet
    reset: Callable[[MongoClient], None] | None = None  # external: put the data back without building it again


@dataclass
class Running:
    """One run's server: ``url`` goes through the proxy when a delay is injected; ``direct_url`` never does."""

    url: str
    direct_url: str
    rtt_ms: float  # injected
    pid: int | None = None  # the embedded server's
    proxy_pid: int | None = None

    def cpu_seconds(self) -> float | None:
        """CPU time the embedded server has used (user + system), None for an external one."""
        if self.pid is None:
            return None
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return None

    def rss_mb(self) -> float | None:
        if self.pid is None:
            return None
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            return None
        return None


class Servers:
    """Where every run happens: a fresh embedded server per run, or fresh databases on an external one."""

    def __init__(self, url: str | None, log: Callable[[str], None] = print, workdir: Path | None = None) -> None:
        self.url = url
        self.log = log
        self.embedded = url is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="zp-bench-"))
        self._owns_workdir = workdir is None
        self.started = 0  # servers started, for the report
        self.notes: list[str] = []
        if url is not None and single_host(url) is None:
            self.notes.append("the URL is not a one-host mongodb:// URL: no delay can be injected, RTT 0 only")

    @property
    def can_delay(self) -> bool:
        return self.embedded or single_host(self.url or "") is not None

    def close(self) -> None:
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # templates -----------------------------------------------------------------------------

    def template(
        self,
        name: str,
        build: Callable[[MongoClient, str, str], dict[str, Any]],
        queue_db: str = "bench_queue",
        cache_db: str = "bench_cache",
    ) -> Template:
        """Build the case's data once (embedded: into a server then stopped, its storage kept)."""
        slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
        if not self.embedded:  # one external server: each case in databases of its own
            queue_db, cache_db = f"bench_{slug}_queue"[:60], f"bench_{slug}_cache"[:60]
        template = Template(name=name, queue_db=queue_db, cache_db=cache_db, build=build)
        started = time.perf_counter()
        if self.embedded:
            template.storage = self.workdir / f"template-{slug}"
            with self._embedded(template.storage) as (url, _pid):
                client = new_client(url)
                try:
                    template.facts = build(client, queue_db, cache_db)
                finally:
                    client.close()
        else:
            template.facts = self._rebuild(template)
        template.build_seconds = time.perf_counter() - started
        return template

    def _rebuild(self, template: Template) -> dict[str, Any]:
        assert self.url is not None  # an external server's
        client = new_client(self.url)
        try:
            existing = set(client.list_database_names())
            for name in (template.queue_db, template.cache_db):
                if name in existing:
                    client.drop_database(name)
            return template.build(client, template.queue_db, template.cache_db)
        finally:
            client.close()

    def drop(self, template: Template) -> None:
        """Forget a template: its storage (embedded) or its databases (external)."""
        if template.storage is not None:
            shutil.rmtree(template.storage, ignore_errors=True)
        elif self.url:
            client = new_client(self.url)
            try:
                for name in (template.queue_db, template.cache_db):
                    client.drop_database(name)
            finally:
                client.close()

    @contextlib.contextmanager
    def _embedded(self, storage: Path, port: int | None = None) -> Iterator[tuple[str, int]]:
        from zombie_pipeline.queue.embedded import start_server, stop_process

        process, info = start_server(storage, port=port, log_path=self.workdir / "servers.log", detach=False)
        self.started += 1
        try:
            yield info.url, process.pid
        finally:
            stop_process(process, timeout_seconds=60)

    # runs ----------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def fresh(self, template: Template, rtt_ms: float = 0.0) -> Iterator[Running]:
        """A server holding exactly the template's data, seen through a proxy adding ``rtt_ms``."""
        with contextlib.ExitStack() as stack:
            if self.embedded:
                assert template.storage is not None
                storage = self.workdir / "run"
                shutil.rmtree(storage, ignore_errors=True)
                shutil.copytree(template.storage, storage)
                stack.callback(shutil.rmtree, storage, True)
                direct_url, pid = stack.enter_context(self._embedded(storage))
            else:
                assert self.url is not None  # an external server
                if not template.pristine and template.reset is not None:
                    client = new_client(self.url)
                    try:
                        template.reset(client)
                    finally:
                        client.close()
                elif not template.pristine:
                    template.facts = {**template.facts, **self._rebuild(template)}
                template.pristine = False
                direct_url, pid = self.url, None
            running = Running(url=direct_url, direct_url=direct_url, rtt_ms=rtt_ms, pid=pid)
            if rtt_ms > 0:
                target = single_host(direct_url)
                if target is None:
                    raise ValueError("no delay can be injected in front of this URL")
                port, proxy_pid = stack.enter_context(delay_proxy(target, rtt_ms))
                running.url, running.proxy_pid = via(direct_url, port), proxy_pid
            yield running


class HistoryServer:
    """The history section's one long-lived server, whose storage can be snapshotted into a template."""

    def __init__(self, servers: Servers) -> None:
        from zombie_pipeline.queue.embedded import free_port

        self.servers = servers
        self.storage = servers.workdir / "history"
        self.port = free_port()
        self.process: subprocess.Popen[Any] | None = None
        self.pid: int | None = None

    @property
    def embedded(self) -> bool:
        return self.servers.embedded

    @property
    def url(self) -> str:
        return self.servers.url or f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self) -> HistoryServer:
        if self.servers.embedded:
            from zombie_pipeline.queue.embedded import start_server

            self.process, _ = start_server(
                self.storage, port=self.port, log_path=self.servers.workdir / "history.log", detach=False
            )
            self.pid = self.process.pid
            self.servers.started += 1
        return self

    def stop(self) -> None:
        if self.process is not None:
            from zombie_pipeline.queue.embedded import stop_process

            stop_process(self.process, timeout_seconds=120)
            self.process, self.pid = None, None

    def snapshot(
        self, name: str, queue_db: str, cache_db: str, facts: dict[str, Any], reset: Callable[[MongoClient], None]
    ) -> Template:
        """A template of the data as it is now.

        Embedded: stop the server, copy its storage, start it again on the same port (its clients reconnect).
        External: the data stays where it is and ``reset`` puts it back between runs.
        """

        def unbuildable(*_: Any) -> dict[str, Any]:
            raise RuntimeError("a history snapshot cannot be built again")

        template = Template(
            name=name, queue_db=queue_db, cache_db=cache_db, build=unbuildable, facts=dict(facts), reset=reset
        )
        if not self.servers.embedded:
            return template
        self.stop()
        slug = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
        template.storage = self.servers.workdir / f"template-{slug}"
        shutil.rmtree(template.storage, ignore_errors=True)
        shutil.copytree(self.storage, template.storage)
        self.start()
        return template

    def rss_mb(self) -> float | None:
        return Running(url="", direct_url="", rtt_ms=0, pid=self.pid).rss_mb()

    def cpu_seconds(self) -> float | None:
        return Running(url="", direct_url="", rtt_ms=0, pid=self.pid).cpu_seconds()
