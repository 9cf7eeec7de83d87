"""The watcher in ``dagster dev``, as the README's quick start runs it: on by default, on a simulated queue whose
workers beat their jobs, it releases a death within seconds of its deadline, in a run the UI lists with its log."""

import datetime as dt
import threading

import pytest

from tests.e2e import harness
from tests.servers import fresh_databases, on_real_mongodb
from zombie_pipeline.cleanup import watch_lease
from zombie_pipeline.config import (
    CACHE_DATABASE_ENV,
    CACHE_URL_ENV,
    HOME_ENV,
    KILL_CRON_ENV,
    QUEUE_DATABASE_ENV,
    QUEUE_URL_ENV,
    WEBHOOK_URL_ENV,
)
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, EventState
from zombie_pipeline.queue.connections import client_for
from zombie_pipeline.queue.embedded import free_port
from zombie_pipeline.queue.generations import QUEUE_GENERATIONS
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.shapes import job_document
from zombie_pipeline.simulation.simulator import simulate
from zombie_pipeline.simulation.workers import WorkerPool, WorkerRates
from zombie_pipeline.simulation.workload import Workload

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # dagster dev up, a watch run started, a death due: ~40 s

#: The simulated workers beat every 10 s and never die by themselves: the test decides who dies.
RATES = WorkerRates(heartbeat_seconds=10, crashes_per_worker_hour=0, overruns_per_worker_hour=0)


def test_dagster_dev_runs_the_watcher_by_default_and_it_releases_a_death_at_its_deadline(mongo_url, tmp_path):
    with fresh_databases(client_for(mongo_url), drop=on_real_mongodb()) as make:
        store = Store.of(make("watch_queue"), make("watch_cache"))
        store.ensure_indexes()
        workload = Workload(
            finished=50, crashed=0, never_heartbeated=0, terminated=0, overdue=0, running=20, waiting=10
        )
        simulate(store, workload)
        pool = WorkerPool(store, QUEUE_GENERATIONS[workload.generation], ZombiePolicy(), RATES)
        pool.adopt_running()
        stopping = threading.Event()
        workers = threading.Thread(target=pool.run, args=(3_600, stopping.is_set), daemon=True)
        workers.start()
        env = {
            QUEUE_URL_ENV: mongo_url,
            CACHE_URL_ENV: mongo_url,
            QUEUE_DATABASE_ENV: store.jobs.database.name,
            CACHE_DATABASE_ENV: store.cache.database.name,
            HOME_ENV: str(tmp_path / "home"),
            KILL_CRON_ENV: "",
            WEBHOOK_URL_ENV: "",
        }
        dev = harness.DagsterDev(tmp_path / "dagster_home", free_port(), env)
        try:
            dev.start()
            lease = harness.wait_for(
                "the watch run started by zombie_watch_sensor to take the lease",
                lambda: watch_lease.alive_watcher(store.watchers, utc_now()),
                timeout=180,
            )
            [run] = [run for run in harness.runs(dev, "zombie_watch_job") if run["runId"] == lease.holder]
            assert run["status"] == "STARTED"
            assert {"key": "dagster/sensor_name", "value": "zombie_watch_sensor"} in run["tags"]

            now = utc_now()  # a worker killed 290 s after its last beat: due in 10 s (the default 300 s timeout)
            dying = job_document(dataset="watch/dying", started_at=now - dt.timedelta(seconds=400),
                                 last_heartbeat=now - dt.timedelta(seconds=290))  # fmt: skip
            store.jobs.insert_one(dying)
            event = harness.wait_for(  # claimed first (the job still started), then done once the job is finished
                "the death to be released",
                lambda: store.events.find_one({ID: dying[ID], Event.STATE: EventState.DONE}),
                timeout=60,
                interval=0.5,
            )
            assert event[Event.RUN_ID] == lease.holder
            assert 0 < event[Event.RELEASE_LAG_SECONDS] < 5
            assert store.jobs.count_documents({ID: dying[ID], Job.STATUS: Status.STARTED}) == 0
            # the simulated workers' jobs, alive, are left alone
            assert store.events.count_documents({}) == 1
            said = harness.wait_for(  # the lease, renewed every 5 s, says what its holder did
                "the lease to count the release",
                lambda: (lease := watch_lease.alive_watcher(store.watchers, utc_now())) and lease.finalized == 1,
                timeout=30,
            )
            assert said
        except Exception:
            print(dev.log_tail())
            raise
        finally:
            stopping.set()
            workers.join(timeout=60)
            pids = dev.stop()
            assert dev.alive(pids) == [], "processes of dagster dev survived the stop"
