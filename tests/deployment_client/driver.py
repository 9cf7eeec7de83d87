"""Drive the deployment's real ``libcommon`` (dataset-viewer / datasets-server) against a MongoDB.

This program runs INSIDE a deployment virtualenv made by ``scripts/deployment_client.py setup``:
it imports that commit's ``libcommon``, connects through the library's own mongo resources, and
executes actions described in JSON, answering in JSON. It imports nothing of zombie-pipeline and
must stay runnable by the Python of any pinned commit (3.9 syntax at most).

Usage::

    python driver.py --check                                   # import libcommon, describe it
    python driver.py --mongo-url URL --queue-db Q --cache-db C '{"action": "state"}'
    python driver.py --mongo-url URL --queue-db Q --cache-db C '[{"action": ...}, ...]'
    python driver.py --mongo-url URL --queue-db Q --cache-db C --serve   # JSON lines on stdin

Every request is ``{"action": NAME, "args": {...}}`` (``"id"`` is echoed back); every answer is
``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {"type", "message", "traceback"}}``.
In ``--serve`` mode one answer line is written per request line, and nothing else reaches stdout
(anything printed by the library goes to stderr).

Actions (arguments in parentheses, all optional unless marked *):

- ``info``: commit generation, library versions, the models and the collections they declare.
- ``connect`` (queue_db*, cache_db*, mongo_url): switch databases (re-creates the connections).
- ``create_jobs`` (jobs*: [{type*, dataset*, revision, config, split, difficulty, priority, force}],
  method: auto|add_job|upsert_job|create_jobs): enqueue through ``Queue``; returns the new ids.
- ``start_job`` (difficulty_min, difficulty_max, only_job_types, max_jobs_per_namespace): start the
  next job as a worker does (takes the lock where the commit has locks).
- ``heartbeat`` (job_id*), ``set_terminated`` (job_id*) where the commit has it.
- ``finish_job`` (job_id*, status: success|error|skipped where the commit takes one).
- ``upsert_response`` (kind*, dataset*, content*, http_status*, config, split, error_code, details,
  job_runner_version, worker_version, dataset_git_revision, progress, duration, failed_runs,
  updated_at): write a cache entry through ``simple_cache.upsert_response``.
- ``find_stuck`` (max_seconds_without_heartbeat*): what the deployment's own killer would pick
  (``get_stuck_jobs`` or ``get_zombies``).
- ``load_all`` (collections): load every document of every model collection through the models
  (iteration, per-document load, ``validate()``, ``to_dict()``/``info()``) and the library's
  readers; errors by collection.
- ``recount_metrics``: every metric collection against a recount of the documents, with the
  library's own recount functions where it has them.
- ``state``: jobs, status counts, locks (owner per key), pastJobs, blockages, cache keys (raw reads).
- ``backfill_reruns`` (dataset*): for each cache entry of the dataset (loaded through its model), whether
  the deployment's backfill re-runs it: ``state.CacheState.is_error_to_retry`` where the module imports,
  else its condition with the library's own ``MAX_FAILED_RUNS_PER_ERROR_CODE`` (an error whose code is
  retryable, below its limit); commits without failed runs' limits refuse.
- ``backfill_difficulty`` (dataset*, difficulty): for each cache entry of the dataset, the difficulty the backfill
  gives its next run from its failed runs, with the library's constants; commits without the bonus refuse.

Actions of an era's backfill, worker and locks (2023-07 on; ``libcommon.orchestrator`` and ``libcommon.state``):

- ``step_versions``: each job type's ``job_runner_version`` in the era's processing graph.
- ``backfill_plan`` (dataset*, revision*): the era's own ``DatasetBackfillPlan`` of the dataset at that revision;
  for each cache entry of the dataset, the plan's verdict (``cache_is_error_to_retry``,
  ``cache_is_job_runner_obsolete``, ``up_to_date``, ...), whether it re-runs it, and what its ``CacheState`` read.
- ``kill_as_crashed`` (job_id*, error: crashed|exceeded): the era's worker finishing a dead job
  (``JobManager.set_crashed`` / ``set_exceeded_maximum_duration``): the error built by its own exception class,
  the step's version from its processing graph, the finish by its orchestrator (error entry, job, locks, next steps).
- ``take_branch_lock`` (dataset*, owner*, branch): ``lock.git_branch(...).acquire()`` with short waits, left held
  (a worker that dies writing to the branch); whether it was taken.
"""

from __future__ import annotations

import argparse
import datetime as dt
import enum
import importlib
import importlib.util
import inspect
import json
import numbers
import os
import pkgutil
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

# ---------------------------------------------------------------------------------------------
# JSON


def to_jsonable(value: Any) -> Any:
    """Convert library values (datetimes, ObjectIds, enums, tuples, sets) into JSON values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, enum.Enum):  # str/int enums (Status, Priority, HTTPStatus)
            # mypy sees no enum in None | int | float | str (it does without the None): a false "unreachable"
            return value.value  # type: ignore[unreachable]
        return value
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # mongo returns naive UTC datetimes
            value = value.replace(tzinfo=dt.UTC)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    type_name = type(value).__name__
    if type_name in ("ObjectId", "Decimal128", "UUID"):
        return str(value)
    return repr(value)


def parse_datetime(value: Any) -> Any:
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return value


def describe_error(error: BaseException) -> dict[str, Any]:
    return {"type": type(error).__name__, "message": str(error)[:2000]}


class ActionError(Exception):
    """A request the driver cannot map onto this commit's API (bad or unsupported arguments)."""


# ---------------------------------------------------------------------------------------------
# The library, whatever its generation


def allow_the_graph_as_a_default() -> None:
    """Let the orchestrator of 2024 import on Python 3.11, unchanged.

    Its dataclasses take the processing graph, itself a dataclass and so unhashable, as a field's default: the
    Python its era pinned (3.9) accepted it, 3.11 refuses it ("mutable default"). The identity hash (what the graph
    would have without ``eq``) restores 3.9's acceptance; nothing compares or hashes graphs.
    """
    try:
        from libcommon.processing_graph import ProcessingGraph
    except ImportError:
        return
    if ProcessingGraph.__hash__ is None:
        ProcessingGraph.__hash__ = object.__hash__


class Library:
    """What this commit's libcommon provides, found by import and introspection."""

    def __init__(self) -> None:
        import libcommon

        self.libcommon = libcommon
        allow_the_graph_as_a_default()
        self.modules: dict[str, Any] = {}
        queue_pkg = importlib.import_module("libcommon.queue")
        self.modules["libcommon.queue"] = queue_pkg
        if hasattr(queue_pkg, "__path__"):  # a package since 2024: queue/jobs.py, lock.py, ...
            for info in pkgutil.iter_modules(queue_pkg.__path__):
                name = "libcommon.queue." + info.name
                self.modules[name] = importlib.import_module(name)
        for name in ("libcommon.simple_cache", "libcommon.resources", "libcommon.constants"):
            self.modules[name] = importlib.import_module(name)
        for name in ("libcommon.dtos", "libcommon.utils"):
            try:
                self.modules[name] = importlib.import_module(name)
            except ImportError:
                pass

        self.queue_module = self.modules.get("libcommon.queue.jobs", queue_pkg)
        self.Queue = self.queue_module.Queue
        status_home = self.modules.get("libcommon.dtos")
        self.Status = getattr(status_home, "Status", None) or self.queue_module.Status
        self.Priority = getattr(status_home, "Priority", None) or self.queue_module.Priority
        self.simple_cache = self.modules["libcommon.simple_cache"]
        self.resources = self.modules["libcommon.resources"]
        self.constants = self.modules["libcommon.constants"]
        self.metrics = self.modules.get("libcommon.queue.metrics")

    # -- models ------------------------------------------------------------------------------

    def models(self) -> list[Any]:
        """Every mongoengine Document declared by the imported libcommon modules."""
        from mongoengine import Document

        found: dict[str, Any] = {}
        for module in self.modules.values():
            for value in vars(module).values():
                if (
                    inspect.isclass(value)
                    and issubclass(value, Document)
                    and value is not Document
                    and value.__module__.startswith("libcommon")
                    and not cast(Any, value)._meta.get("abstract")  # mongoengine is untyped
                ):
                    found[value.__module__ + "." + value.__name__] = value
        return sorted(found.values(), key=lambda model: (self.alias_of(model), model._get_collection_name()))

    @staticmethod
    def alias_of(model: Any) -> str:
        return model._meta.get("db_alias") or "default"

    def models_by_collection(self) -> dict[str, Any]:
        return {model._get_collection_name(): model for model in self.models()}

    def model_for(self, collection: str) -> Any | None:
        return self.models_by_collection().get(collection)

    def queue_alias(self) -> str:
        return getattr(self.constants, "QUEUE_MONGOENGINE_ALIAS", "queue")

    def cache_alias(self) -> str:
        return getattr(self.constants, "CACHE_MONGOENGINE_ALIAS", "cache")

    def generation(self) -> dict[str, Any]:
        job_model = self.job_model()
        fields = sorted(job_model._fields) if job_model is not None else []
        return {
            "queue_is_package": hasattr(self.modules["libcommon.queue"], "__path__"),
            "statuses": [status.value for status in self.Status],
            "priorities": [priority.value for priority in self.Priority],
            "job_fields": fields,
            "keeps_finished_jobs": "finished_at" in fields,
            "has_locks": self.model_for("locks") is not None,
            "queue_methods": sorted(
                name
                for name in (
                    "add_job",
                    "upsert_job",
                    "create_jobs",
                    "start_job",
                    "finish_job",
                    "heartbeat",
                    "set_terminated",
                    "get_stuck_jobs",
                    "get_zombies",
                    "kill_zombies",
                    "kill_long_job",
                )
                if hasattr(self.Queue, name)
            ),
        }

    def job_model(self) -> Any | None:
        return self.model_for(getattr(self.constants, "QUEUE_COLLECTION_JOBS", "jobsBlue"))

    def cache_model(self) -> Any | None:
        return self.model_for(getattr(self.constants, "CACHE_COLLECTION_RESPONSES", "cachedResponsesBlue"))

    #: Modules beyond the queue's and the cache's that the era tests drive: its backfill rule, and its worker's finish.
    ERA_MODULES = ("libcommon.state", "libcommon.orchestrator", "libcommon.processing_graph")

    def imports(self) -> dict[str, Any]:
        """Each of :attr:`ERA_MODULES` the commit has: None where it imports, else why not."""
        found: dict[str, Any] = {}
        for name in self.ERA_MODULES:
            if importlib.util.find_spec(name) is None:
                continue
            try:
                importlib.import_module(name)
                found[name] = None
            except Exception as error:  # noqa: BLE001  (a missing dependency, or a Python too old for its syntax)
                found[name] = f"{type(error).__name__}: {error}"
        return found

    def describe(self) -> dict[str, Any]:
        from importlib import metadata

        return {
            "libcommon_file": self.libcommon.__file__,
            "python": sys.version.split()[0],
            "mongoengine": metadata.version("mongoengine"),
            "pymongo": metadata.version("pymongo"),
            "modules": sorted(self.modules),
            "imports": self.imports(),
            "models": {
                model._get_collection_name(): {
                    "class": model.__name__,
                    "module": model.__module__,
                    "alias": self.alias_of(model),
                    "fields": sorted(model._fields),
                }
                for model in self.models()
            },
            "generation": self.generation(),
        }


# ---------------------------------------------------------------------------------------------
# Connections


class Connections:
    """The queue and cache connections, made the way the deployment makes them."""

    def __init__(self, library: Library) -> None:
        self.library = library
        self.resources: list[Any] = []
        self.mongo_url: str | None = None
        self.queue_db: str | None = None
        self.cache_db: str | None = None

    def connect(self, mongo_url: str, queue_db: str, cache_db: str) -> None:
        self.close()
        resources = self.library.resources
        queue_resource = getattr(resources, "QueueMongoResource", None)
        cache_resource = getattr(resources, "CacheMongoResource", None)
        if queue_resource is not None and cache_resource is not None:
            self.resources = [
                queue_resource(database=queue_db, host=mongo_url, server_selection_timeout_ms=10_000),
                cache_resource(database=cache_db, host=mongo_url, server_selection_timeout_ms=10_000),
            ]
        else:  # before 2023-02 the services called mongoengine.connect themselves
            from mongoengine import connect

            connect(db=queue_db, host=mongo_url, alias=self.library.queue_alias())
            connect(db=cache_db, host=mongo_url, alias=self.library.cache_alias())
        # a model keeps its collection object: forget it, the database may have changed
        for model in self.library.models():
            model._collection = None
        self.mongo_url, self.queue_db, self.cache_db = mongo_url, queue_db, cache_db

    def close(self) -> None:
        for resource in self.resources:
            resource.release()
        if not self.resources and self.mongo_url is not None:
            from mongoengine import disconnect

            disconnect(alias=self.library.queue_alias())
            disconnect(alias=self.library.cache_alias())
        self.resources = []
        for model in self.library.models():
            model._collection = None

    def raw_collection(self, model: Any) -> Any:
        """The model's collection through pymongo, without codecs or models (for summaries)."""
        from mongoengine.connection import get_db

        return get_db(self.library.alias_of(model))[model._get_collection_name()]


# ---------------------------------------------------------------------------------------------
# Helpers for calling an API whose signature changed across commits


def call_with_supported(function: Callable[..., Any], kwargs: dict[str, Any], what: str) -> Any:
    """Call ``function`` with the non-null arguments; refuse one it does not take at this commit."""
    parameters = inspect.signature(function).parameters
    accepted = {}
    for name, value in kwargs.items():
        if value is None:  # the library's own default applies
            continue
        if name in parameters:
            accepted[name] = value
        else:
            raise ActionError(f"{what} at this commit takes no argument {name!r} (got {value!r})")
    return function(**accepted)


def same_as(column: Any, value: Any) -> Any:
    """The rows of a pandas column equal to ``value``; a None (a dataset-level entry's config) matches the missing."""
    return column.isna() if value is None else column == value


def accepts(function: Callable[..., Any], name: str) -> bool:
    return name in inspect.signature(function).parameters


# ---------------------------------------------------------------------------------------------
# Actions


class Driver:
    def __init__(self, library: Library) -> None:
        self.library = library
        self.connections = Connections(library)
        self.actions: dict[str, Callable[[dict[str, Any]], Any]] = {
            "info": self.info,
            "connect": self.connect,
            "create_jobs": self.create_jobs,
            "start_job": self.start_job,
            "heartbeat": self.heartbeat,
            "set_terminated": self.set_terminated,
            "finish_job": self.finish_job,
            "upsert_response": self.upsert_response,
            "find_stuck": self.find_stuck,
            "load_all": self.load_all,
            "ensure_indexes": self.ensure_indexes,
            "recount_metrics": self.recount_metrics,
            "state": self.state,
            "backfill_reruns": self.backfill_reruns,
            "backfill_difficulty": self.backfill_difficulty,
            "step_versions": self.step_versions,
            "backfill_plan": self.backfill_plan,
            "kill_as_crashed": self.kill_as_crashed,
            "take_branch_lock": self.take_branch_lock,
        }

    # -- protocol ----------------------------------------------------------------------------

    def handle(self, request: Any) -> dict[str, Any]:
        answer: dict[str, Any] = {}
        if isinstance(request, dict) and "id" in request:
            answer["id"] = request["id"]
        try:
            if not isinstance(request, dict) or not isinstance(request.get("action"), str):
                raise ActionError('a request is {"action": NAME, "args": {...}}')
            action = self.actions.get(request["action"])
            if action is None:
                raise ActionError(f"unknown action {request['action']!r}; known: {sorted(self.actions)}")
            args = request.get("args") or {}
            if not isinstance(args, dict):
                raise ActionError("args must be an object")
            if request["action"] not in ("info", "connect") and self.connections.mongo_url is None:
                raise ActionError("not connected: give --mongo-url/--queue-db/--cache-db or call connect")
            answer["ok"] = True
            answer["result"] = to_jsonable(action(args))
        except Exception as error:  # every failure is an answer, the driver keeps serving
            answer["ok"] = False
            answer["error"] = dict(describe_error(error), traceback=traceback.format_exc()[-4000:])
        return answer

    # -- actions -----------------------------------------------------------------------------

    def info(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.library.describe()

    def connect(self, args: dict[str, Any]) -> dict[str, Any]:
        mongo_url = args.get("mongo_url") or self.connections.mongo_url
        if not mongo_url or not args.get("queue_db") or not args.get("cache_db"):
            raise ActionError("connect needs queue_db, cache_db (and mongo_url unless given at start)")
        self.connections.connect(mongo_url, args["queue_db"], args["cache_db"])
        return {"queue_db": args["queue_db"], "cache_db": args["cache_db"]}

    def _queue(self, args: dict[str, Any]) -> Any:
        kwargs = {}
        if "max_jobs_per_namespace" in args:
            kwargs["max_jobs_per_namespace"] = args["max_jobs_per_namespace"]
        return call_with_supported(self.library.Queue, kwargs, "Queue()")

    def _priority(self, value: Any) -> Any:
        return None if value is None else self.library.Priority(value)

    def _job_ids(self) -> list[str]:
        model = self.library.job_model()
        return [str(doc["_id"]) for doc in self.connections.raw_collection(model).find({}, {"_id": 1})]

    def create_jobs(self, args: dict[str, Any]) -> dict[str, Any]:
        jobs = args.get("jobs")
        if not isinstance(jobs, list) or not jobs:
            raise ActionError("create_jobs needs jobs: a non-empty list of {type, dataset, ...}")
        queue = self._queue(args)
        method = args.get("method") or "auto"
        if method == "auto":
            method = next(name for name in ("add_job", "upsert_job", "create_jobs") if hasattr(queue, name))
        if not hasattr(queue, method):
            raise ActionError(f"Queue at this commit has no method {method!r}")
        default_difficulty = getattr(self.library.constants, "DEFAULT_DIFFICULTY", 50)
        specs = []
        for job in jobs:
            unknown = set(job) - {"type", "dataset", "revision", "config", "split", "difficulty", "priority", "force"}
            if unknown or "type" not in job or "dataset" not in job:
                raise ActionError(
                    f"a job is {{type, dataset, revision, config, split, difficulty, priority, force}}: {job}"
                )
            specs.append(job)
        if method == "create_jobs":
            before = set(self._job_ids())
            job_infos = [
                {
                    "job_id": "not used",
                    "type": job["type"],
                    "params": {
                        "dataset": job["dataset"],
                        "revision": job.get("revision", "main"),
                        "config": job.get("config"),
                        "split": job.get("split"),
                    },
                    "priority": self._priority(job.get("priority", "low")),
                    "difficulty": job.get("difficulty", default_difficulty),
                }
                for job in specs
            ]
            created = queue.create_jobs(job_infos)
            if created != len(job_infos):
                raise ActionError(f"Queue.create_jobs created {created} of {len(job_infos)} jobs")
            return {"method": method, "job_ids": sorted(set(self._job_ids()) - before)}
        function = getattr(queue, method)
        job_ids = []
        for job in specs:
            kwargs = {
                "job_type": job["type"],
                "dataset": job["dataset"],
                "config": job.get("config"),
                "split": job.get("split"),
                "priority": self._priority(job.get("priority")),
                "force": job.get("force"),
                "revision": job.get("revision"),
                "difficulty": job.get("difficulty"),
            }
            if accepts(function, "revision") and kwargs["revision"] is None:
                kwargs["revision"] = "main"
            if accepts(function, "difficulty") and kwargs["difficulty"] is None:
                kwargs["difficulty"] = default_difficulty
            if kwargs["force"] is False and not accepts(function, "force"):
                kwargs["force"] = None
            created = call_with_supported(function, kwargs, f"Queue.{method}")
            job_ids.append(str(created.pk))
        return {"method": method, "job_ids": job_ids}

    def start_job(self, args: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(args)
        kwargs = {name: args.get(name) for name in ("difficulty_min", "difficulty_max", "only_job_types")}
        try:
            info = call_with_supported(queue.start_job, kwargs, "Queue.start_job")
        except ActionError:
            raise
        except Exception as error:  # EmptyQueueError, AlreadyStartedJobError, LockTimeoutError, ...
            return {"started": False, "exception": type(error).__name__, "message": str(error)}
        return {"started": True, "job_id": info["job_id"], "info": info}

    def heartbeat(self, args: dict[str, Any]) -> dict[str, Any]:
        self._queue(args).heartbeat(job_id=self._required(args, "job_id"))
        return {"job_id": args["job_id"]}

    def set_terminated(self, args: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(args)
        if not hasattr(queue, "set_terminated"):
            raise ActionError("Queue at this commit has no set_terminated")
        queue.set_terminated(job_id=self._required(args, "job_id"))
        return {"job_id": args["job_id"]}

    def finish_job(self, args: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(args)
        job_id = self._required(args, "job_id")
        status = args.get("status")
        if accepts(queue.finish_job, "finished_status"):  # 2023: success / error / skipped
            returned = queue.finish_job(job_id=job_id, finished_status=self.library.Status(status or "success"))
            return {"job_id": job_id, "status": status or "success", "returned": returned}
        if accepts(queue.finish_job, "is_success"):  # mid-2023: a boolean
            returned = queue.finish_job(job_id=job_id, is_success=(status or "success") == "success")
            return {"job_id": job_id, "status": status or "success", "returned": returned}
        # since 2023-12 the job is deleted; success or error only reaches the cache
        returned = queue.finish_job(job_id=job_id)
        return {"job_id": job_id, "status": None, "status_ignored": status is not None, "returned": returned}

    def upsert_response(self, args: dict[str, Any]) -> dict[str, Any]:
        from http import HTTPStatus

        for name in ("kind", "dataset", "content", "http_status"):
            self._required(args, name)
        kwargs = dict(args)
        kwargs["http_status"] = HTTPStatus(int(args["http_status"]))
        if "updated_at" in kwargs:
            kwargs["updated_at"] = parse_datetime(kwargs["updated_at"])
        call_with_supported(self.library.simple_cache.upsert_response, kwargs, "simple_cache.upsert_response")
        return {
            "kind": args["kind"],
            "dataset": args["dataset"],
            "config": args.get("config"),
            "split": args.get("split"),
        }

    def find_stuck(self, args: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(args)
        seconds = self._required(args, "max_seconds_without_heartbeat")
        if hasattr(queue, "get_stuck_jobs"):
            stuck = queue.get_stuck_jobs(max_seconds_without_heartbeat=seconds)
            return {
                "method": "get_stuck_jobs",
                "jobs": [{"job_id": info["job_id"], "reason": reason} for info, reason in stuck],
            }
        if hasattr(queue, "get_zombies"):
            zombies = queue.get_zombies(max_seconds_without_heartbeat=seconds)
            return {
                "method": "get_zombies",
                "jobs": [{"job_id": info["job_id"], "reason": "missing heartbeats"} for info in zombies],
            }
        raise ActionError("Queue at this commit finds no stuck jobs")

    def backfill_reruns(self, args: dict[str, Any]) -> dict[str, Any]:
        dataset = self._required(args, "dataset")
        limits = getattr(self.library.constants, "MAX_FAILED_RUNS_PER_ERROR_CODE", None)
        if limits is None:
            raise ActionError("libcommon at this commit has no failed runs' limits (constants.MAX_FAILED_RUNS_...)")
        try:  # the backfill's own rule; its module needs networkx, which a client's environment may lack
            from libcommon.state import CacheState
        except ImportError:
            CacheState = None  # noqa: N806
        model = self.library.simple_cache.CachedResponseDocument
        reruns = []
        for document in model.objects(dataset=dataset):  # loaded through the strict model
            entry = {
                "kind": document.kind,
                "config": document.config,
                "split": document.split,
                "error_code": document.error_code,
                "failed_runs": int(document.failed_runs),
                "http_status": int(document.http_status),
            }
            if CacheState is not None:
                frame = self.library.simple_cache.get_cache_entries_df(dataset=dataset, cache_kinds=[document.kind])
                frame = frame[same_as(frame["config"], document.config) & same_as(frame["split"], document.split)]
                state = CacheState(dataset, document.config, document.split, document.kind, 1, frame)
                entry["rerun"], entry["rule"] = bool(state.is_error_to_retry()), "CacheState.is_error_to_retry"
            else:  # CacheState.is_error_to_retry's condition, with the library's own limits
                entry["rerun"] = (
                    entry["http_status"] >= 400
                    and entry["error_code"] in limits
                    and entry["failed_runs"] < limits[entry["error_code"]]
                )
                entry["rule"] = "constants.MAX_FAILED_RUNS_PER_ERROR_CODE"
            reruns.append(entry)
        return {"entries": reruns}

    def backfill_difficulty(self, args: dict[str, Any]) -> dict[str, Any]:
        """The difficulty the backfill gives the next run of each of the dataset's entries (loaded through the model):
        the step's own (``difficulty``, default the library's DEFAULT_DIFFICULTY) + failed runs x
        DIFFICULTY_BONUS_BY_FAILED_RUNS, up to DEFAULT_DIFFICULTY_MAX, as orchestrator.py's backfill plan computes it
        (its bonus for a big dataset aside), with the library's own constants."""
        dataset = self._required(args, "dataset")
        constants = self.library.constants
        bonus = getattr(constants, "DIFFICULTY_BONUS_BY_FAILED_RUNS", None)
        if bonus is None:
            raise ActionError("libcommon at this commit raises no difficulty by failed runs")
        base = args.get("difficulty", constants.DEFAULT_DIFFICULTY)
        entries = []
        for document in self.library.simple_cache.CachedResponseDocument.objects(dataset=dataset):
            failed_runs = int(document.failed_runs)
            difficulty = min(constants.DEFAULT_DIFFICULTY_MAX, base + failed_runs * bonus)
            entries.append({"kind": document.kind, "failed_runs": failed_runs, "difficulty": difficulty})
        return {"entries": entries}

    # -- an era's backfill, worker and locks -------------------------------------------------

    def _processing_graph(self) -> Any:
        module = importlib.import_module("libcommon.processing_graph")
        graph = getattr(module, "processing_graph", None)
        if graph is None:  # until 2023-12 each service built it from its configuration
            from libcommon.config import ProcessingGraphConfig

            graph = module.ProcessingGraph(config=ProcessingGraphConfig())
        return graph

    def step_versions(self, args: dict[str, Any]) -> dict[str, Any]:
        graph = self._processing_graph()
        return {step.job_type: step.job_runner_version for step in graph.get_topologically_ordered_processing_steps()}

    def backfill_plan(self, args: dict[str, Any]) -> dict[str, Any]:
        """The era's ``DatasetBackfillPlan``: its verdict on every cache entry of the dataset."""
        dataset, revision = self._required(args, "dataset"), self._required(args, "revision")
        orchestrator = importlib.import_module("libcommon.orchestrator")
        graph = self._processing_graph()
        plan_class = orchestrator.DatasetBackfillPlan
        kwargs: dict[str, Any] = {"dataset": dataset, "revision": revision, "processing_graph": graph}
        if accepts(plan_class, "cache_max_days"):  # 2023: entries older than this were re-run too
            from libcommon.config import CacheConfig

            kwargs["cache_max_days"] = CacheConfig().max_days
        plan = plan_class(**kwargs)
        verdicts: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
        for bucket, artifacts in vars(plan.cache_status).items():
            for artifact in artifacts.values():
                metadata = artifact.cache_state.cache_entry_metadata or {}
                seen = metadata.get("job_runner_version")
                verdicts[(artifact.processing_step.cache_kind, artifact.config, artifact.split)] = {
                    "verdict": bucket,
                    "rerun": bucket != "up_to_date",
                    "step_version": artifact.processing_step.job_runner_version,
                    # what its CacheState read: an int, None (2023: pd.NA), or NaN (2024)
                    "runner_version_read": int(seen) if isinstance(seen, numbers.Integral) else repr(seen),
                    "failed_runs_read": to_jsonable(metadata.get("failed_runs")),
                }
        entries = []
        for document in self.library.simple_cache.CachedResponseDocument.objects(dataset=dataset):
            entry = {
                "kind": document.kind,
                "config": document.config,
                "split": document.split,
                "http_status": int(document.http_status),
                "error_code": document.error_code,
                "job_runner_version": document.job_runner_version,
                "failed_runs": getattr(document, "failed_runs", None),
            }
            entry.update(verdicts.get((document.kind, document.config, document.split), {"verdict": None}))
            entries.append(entry)
        return {"entries": entries}

    def kill_as_crashed(self, args: dict[str, Any]) -> dict[str, Any]:
        """The era's worker finishing a job whose worker died (or ran too long), through the era's own code."""
        from http import HTTPStatus

        job_id = self._required(args, "job_id")
        orchestrator = importlib.import_module("libcommon.orchestrator")
        exceptions = importlib.import_module("libcommon.exceptions")
        if args.get("error") == "exceeded":
            error = exceptions.JobManagerExceededMaximumDurationError(
                message="Job manager was killed while running this job (job exceeded maximum duration)."
            )
        else:
            error = exceptions.JobManagerCrashedError(
                message="Job manager crashed while running this job (missing heartbeats)."
            )
        graph = self._processing_graph()
        job = self.library.Queue().get_job_with_id(job_id=job_id)
        job_info = job.info()
        started_at = job.started_at.replace(tzinfo=dt.UTC) if job.started_at else None
        job_result = {
            "job_info": job_info,
            "job_runner_version": graph.get_processing_step_by_job_type(job_info["type"]).job_runner_version,
            "is_success": False,
            "output": {
                "content": dict(error.as_response()),
                "http_status": HTTPStatus(error.status_code),
                "error_code": error.code,
                "details": dict(error.as_response_with_cause()),
                "progress": None,
            },
            # read from 2024-06 (JobManager's get_duration_or_none), ignored before
            "duration": (dt.datetime.now(dt.UTC) - started_at).total_seconds() if started_at else None,
        }
        if hasattr(orchestrator, "DatasetOrchestrator"):  # 2023: the dataset's orchestrator finishes it
            orchestrator.DatasetOrchestrator(
                dataset=job_info["params"]["dataset"], processing_graph=graph, blocked_datasets=[]
            ).finish_job(job_result=job_result)
        else:
            orchestrator.finish_job(job_result=job_result, processing_graph=graph)
        return {"job_id": job_id, "job_runner_version": job_result["job_runner_version"], "error_code": error.code}

    def _lock_class(self) -> Any:
        for module in self.library.modules.values():
            candidate = getattr(module, "lock", None)
            if inspect.isclass(candidate) and hasattr(candidate, "git_branch"):
                return candidate
        raise ActionError("libcommon at this commit has no lock with git_branch")

    def take_branch_lock(self, args: dict[str, Any]) -> dict[str, Any]:
        dataset, owner = self._required(args, "dataset"), self._required(args, "owner")
        branch = args.get("branch") or "refs/convert/parquet"
        branch_lock = self._lock_class().git_branch(dataset=dataset, branch=branch, owner=str(owner), sleeps=[0.05] * 3)
        try:
            branch_lock.acquire()
        except TimeoutError:
            return {"taken": False, "key": branch_lock.key}
        return {"taken": True, "key": branch_lock.key}

    # -- load_all ----------------------------------------------------------------------------

    def load_all(self, args: dict[str, Any]) -> dict[str, Any]:
        wanted = args.get("collections")
        collections: dict[str, Any] = {}
        for model in self.library.models():
            name = model._get_collection_name()
            if wanted is not None and name not in wanted:
                continue
            collections[name] = self._load_collection(model)
        readers = self._run_readers() if wanted is None else {}
        errors = {
            name: sorted({f"{error['type']}: {error['message']}" for error in report["errors"]})
            for name, report in collections.items()
            if report["errors"]
        }
        reader_errors = {name: f"{r['type']}: {r['message']}" for name, r in readers.items() if not r["ok"]}
        return {
            "ok": not errors and not reader_errors,
            "collections": collections,
            "errors": errors,
            "error_types": {
                name: sorted({error["type"] for error in report["errors"]})
                for name, report in collections.items()
                if report["errors"]
            },
            "readers": readers,
            "reader_errors": reader_errors,
        }

    def ensure_indexes(self, args: dict[str, Any]) -> dict[str, Any]:
        """Each model's index creation, as the deployment runs it at startup: the errors per collection, and the indexes."""
        errors: dict[str, str] = {}
        indexes: dict[str, dict[str, Any]] = {}
        for model in self.library.models():
            name = model._get_collection_name()
            try:
                model.ensure_indexes()
            except Exception as error:  # an option or name conflict with an index already there
                errors[name] = f"{type(error).__name__}: {error}"
            indexes[name] = {
                index: [list(key) for key in info["key"]]
                for index, info in model._get_collection().index_information().items()
            }
        return {"ok": not errors, "errors": errors, "indexes": indexes}

    def _load_collection(self, model: Any) -> dict[str, Any]:
        report: dict[str, Any] = {
            "model": model.__name__,
            "database": "queue" if self.library.alias_of(model) == self.library.queue_alias() else "cache",
            "documents": 0,
            "loaded": 0,
            "errors": [],
        }
        # 1. as the deployment reads: iterate the queryset (the first bad document aborts it)
        try:
            iterated = sum(1 for _ in model.objects())
            report["iterated"] = iterated
        except Exception as error:
            report["errors"].append(dict(describe_error(error), stage="iterate"))
        # 2. document by document, to name every bad one
        raw_documents = list(model._get_collection().find())
        report["documents"] = len(raw_documents)
        for raw in raw_documents:
            document_id = to_jsonable(raw.get("_id"))
            stage = "load"
            try:
                document = model._from_son(raw)
                stage = "validate"
                document.validate()
                for method in ("to_dict", "info", "flat_info"):
                    if callable(getattr(document, method, None)):
                        stage = method
                        getattr(document, method)()
                report["loaded"] += 1
            except Exception as error:
                report["errors"].append(dict(describe_error(error), stage=stage, _id=document_id))
        return report

    def _run_readers(self) -> dict[str, Any]:
        """The library's own readers of whole documents, on every job type and cache kind present."""
        readers: dict[str, Any] = {}

        def attempt(name: str, function: Callable[..., Any]) -> None:
            try:
                value = function()
                readers[name] = {"ok": True, "items": len(value) if hasattr(value, "__len__") else None}
            except Exception as error:
                readers[name] = dict(describe_error(error), ok=False)

        queue = self.library.Queue()
        job_model = self.library.job_model()
        if job_model is not None and hasattr(queue, "get_dump_by_pending_status"):
            for job_type in sorted(self.connections.raw_collection(job_model).distinct("type")):
                attempt(
                    f"Queue.get_dump_by_pending_status({job_type})",
                    lambda job_type=job_type: queue.get_dump_by_pending_status(job_type=job_type),
                )
        cache_model = self.library.cache_model()
        reports = getattr(self.library.simple_cache, "get_cache_reports_with_content", None)
        if cache_model is not None and reports is not None:
            for kind in sorted(self.connections.raw_collection(cache_model).distinct("kind")):
                attempt(
                    f"simple_cache.get_cache_reports_with_content({kind})",
                    lambda kind=kind: reports(kind=kind, cursor=None, limit=1000)["cache_reports_with_content"],
                )
        return readers

    # -- recount_metrics ---------------------------------------------------------------------

    def recount_metrics(self, args: dict[str, Any]) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        job_totals = self.library.model_for("jobTotalMetric")  # declared in queue.py until 2024, in metrics.py after
        if job_totals is not None:
            metrics["jobTotalMetric"] = self._job_total_metric(job_totals)
        worker_sizes = self.library.model_for("workerTypeJobCounts")
        if worker_sizes is not None:
            metrics["workerTypeJobCounts"] = self._worker_size_metric(worker_sizes)
        cache_metric = getattr(self.library.simple_cache, "CacheTotalMetricDocument", None)
        if cache_metric is not None:
            metrics["cacheTotalMetric"] = self._cache_total_metric(cache_metric)
        return {
            "ok": all(not report["differences"] for report in metrics.values()),
            "metrics": metrics,
            "differences": {name: report["differences"] for name, report in metrics.items() if report["differences"]},
        }

    @staticmethod
    def _compare(stored: dict[Any, int], recount: dict[Any, int], key_names: list[str]) -> list[dict[str, Any]]:
        """Rows where the stored counter and the recount differ; an absent counter counts as 0."""
        differences = []
        for key in sorted(set(stored) | set(recount), key=lambda k: json.dumps(to_jsonable(k))):
            if stored.get(key, 0) != recount.get(key, 0):
                values = key if isinstance(key, tuple) else (key,)
                row = dict(zip(key_names, to_jsonable(list(values))))
                row.update(stored=stored.get(key), recount=recount.get(key, 0))
                differences.append(row)
        return differences

    @staticmethod
    def _rows(counts: dict[Any, int], key_names: list[str]) -> list[dict[str, Any]]:
        rows = []
        for key, total in counts.items():
            values = key if isinstance(key, tuple) else (key,)
            rows.append(dict(zip(key_names, to_jsonable(list(values))), total=total))
        return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))

    def _job_total_metric(self, model: Any) -> dict[str, Any]:
        queue = self.library.Queue()
        keys: list[str]
        stored: dict[tuple[Any, ...], int]
        recount: dict[tuple[Any, ...], int]
        if "dataset_status" in model._fields:  # 2024-07 on
            keys = ["job_type", "status", "dataset_status"]
            stored = {(m.job_type, m.status, m.dataset_status): m.total for m in model.objects()}
            recount_by = "Queue.get_jobs_total_by_type_status_and_dataset_status"
            recount = dict(queue.get_jobs_total_by_type_status_and_dataset_status())
        else:
            keys = ["job_type", "status"]
            stored = {(m.job_type, m.status): m.total for m in model.objects()}
            if hasattr(queue, "get_jobs_total_by_type_and_status"):  # 2023-12
                recount_by = "Queue.get_jobs_total_by_type_and_status"
                recount = dict(queue.get_jobs_total_by_type_and_status())
            else:  # 2023-07: every status of each job type, finished ones included
                recount_by = "Queue.get_jobs_count_by_status"
                job_types = self.connections.raw_collection(self.library.job_model()).distinct("type")
                recount = {
                    (job_type, status): total
                    for job_type in set(job_types) | {key[0] for key in stored}
                    for status, total in queue.get_jobs_count_by_status(job_type=job_type).items()
                    if total
                }
        return {
            "recount_by": recount_by,
            "stored": self._rows(stored, keys),
            "recount": self._rows(recount, keys),
            "differences": self._compare(stored, recount, keys),
        }

    def _worker_size_metric(self, model: Any) -> dict[str, Any]:
        # The counters are kept by every insert/start/finish for WAITING jobs of datasets that are not
        # blocked (metrics.increase_metric / decrease_metric); the library's periodic recount
        # (Queue.get_jobs_count_by_worker_size, run by cache_maintenance) counts waiting AND started
        # jobs. Both are reported; "differences" is against what the incremental updates maintain.
        stored = {to_jsonable(m.worker_size): m.jobs_count for m in model.objects()}
        blocked = set()
        blockages = self.library.modules.get("libcommon.queue.dataset_blockages")
        if blockages is not None:
            blocked = set(blockages.get_blocked_datasets())
        waiting: Counter = Counter()
        job_model = self.library.job_model()
        for job in self.connections.raw_collection(job_model).find(
            {"status": self.library.Status.WAITING.value}, {"dataset": 1, "difficulty": 1}
        ):
            if job.get("dataset") in blocked:
                continue
            difficulty = job.get("difficulty")
            size = "no difficulty" if difficulty is None else to_jsonable(model.get_worker_size(difficulty=difficulty))
            waiting[size] += 1
        library_recount = {}
        if hasattr(self.library.Queue, "get_jobs_count_by_worker_size"):
            library_recount = dict(self.library.Queue().get_jobs_count_by_worker_size())
        return {
            "recount_by": "waiting jobs of unblocked datasets by WorkerSizeJobsCountDocument.get_worker_size",
            "stored": self._rows(stored, ["worker_size"]),
            "recount": self._rows(dict(waiting), ["worker_size"]),
            "library_recount": self._rows(library_recount, ["worker_size"]),
            "differences": self._compare(stored, dict(waiting), ["worker_size"]),
            "differences_from_library_recount": self._compare(stored, library_recount, ["worker_size"]),
        }

    def _cache_total_metric(self, model: Any) -> dict[str, Any]:
        keys = ["kind", "http_status", "error_code"]
        stored = {(m.kind, m.http_status, m.error_code): m.total for m in model.objects()}
        counts = self.library.simple_cache.get_responses_count_by_kind_status_and_error_code()
        if isinstance(counts, list):  # 2023: a row per (kind, http_status, error_code)
            counts = {(row["kind"], row["http_status"], row["error_code"]): row["count"] for row in counts}
        recount = dict(counts)
        return {
            "recount_by": "simple_cache.get_responses_count_by_kind_status_and_error_code",
            "stored": self._rows(stored, keys),
            "recount": self._rows(recount, keys),
            "differences": self._compare(stored, recount, keys),
        }

    # -- state -------------------------------------------------------------------------------

    def state(self, args: dict[str, Any]) -> dict[str, Any]:
        """A summary from raw reads, so that it works on documents the models refuse."""
        library = self.library
        by_collection = library.models_by_collection()

        def raw(name: str) -> Any:  # a collection, or None
            model = by_collection.get(name)
            return None if model is None else self.connections.raw_collection(model)

        result: dict[str, Any] = {}
        jobs = raw(getattr(library.constants, "QUEUE_COLLECTION_JOBS", "jobsBlue"))
        job_rows = []
        for doc in jobs.find().sort("created_at", 1):
            row = {"id": doc["_id"]}
            for field in (
                "type",
                "dataset",
                "revision",
                "config",
                "split",
                "status",
                "unicity_id",
                "priority",
                "difficulty",
                "created_at",
                "started_at",
                "last_heartbeat",
                "finished_at",
                "terminated_at",
            ):
                if field in doc:
                    row[field] = doc[field]
            extra = sorted(set(doc) - set(row) - {"_id", "namespace", "force"})
            if extra:
                row["undeclared_or_other_fields"] = extra
            job_rows.append(row)
        result["jobs"] = job_rows
        result["job_status_counts"] = dict(Counter(str(row.get("status")) for row in job_rows))

        locks = raw(getattr(library.constants, "QUEUE_COLLECTION_LOCKS", "locks"))
        if locks is None:
            result["locks"] = None
            result["lock_details"] = None
        else:
            details = list(locks.find().sort("_id", 1))
            result["locks"] = {str(doc["_id"]): doc.get("owner") for doc in details}
            result["lock_details"] = details
        past_jobs = raw(getattr(library.constants, "QUEUE_COLLECTION_PAST_JOBS", "pastJobs"))
        result["past_jobs"] = (
            None
            if past_jobs is None
            else [{k: v for k, v in doc.items() if k != "_id"} for doc in past_jobs.find().sort("finished_at", 1)]
        )
        blockages = raw(getattr(library.constants, "QUEUE_COLLECTION_DATASET_BLOCKAGES", "datasetBlockages"))
        result["blockages"] = (
            None
            if blockages is None
            else [{k: v for k, v in doc.items() if k != "_id"} for doc in blockages.find().sort("blocked_at", 1)]
        )
        cache = self.connections.raw_collection(library.cache_model())
        result["cache"] = [
            {k: doc.get(k) for k in ("kind", "dataset", "config", "split", "http_status", "error_code")}
            for doc in cache.find({}, {"content": 0, "details": 0}).sort([("kind", 1), ("dataset", 1)])
        ]
        return result

    @staticmethod
    def _required(args: dict[str, Any], name: str) -> Any:
        if args.get(name) is None:
            raise ActionError(f"argument {name!r} is required")
        return args[name]


# ---------------------------------------------------------------------------------------------
# Main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mongo-url")
    parser.add_argument("--queue-db")
    parser.add_argument("--cache-db")
    parser.add_argument("--check", action="store_true", help="import libcommon, print its description, exit")
    parser.add_argument("--serve", action="store_true", help="answer JSON-lines requests read from stdin")
    parser.add_argument("requests", nargs="?", help="a JSON request or list of requests ('-' or absent: stdin)")
    options = parser.parse_args(argv)

    # stdout carries answers only: whatever else writes to it (prints, C libraries) goes to stderr
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(value: Any) -> None:
        answers.write(json.dumps(value, default=str) + "\n")
        answers.flush()

    library = Library()
    driver = Driver(library)
    if options.check:
        answer({"ok": True, "result": to_jsonable(library.describe())})
        return 0
    if options.mongo_url or options.queue_db or options.cache_db:
        if not (options.mongo_url and options.queue_db and options.cache_db):
            parser.error("--mongo-url, --queue-db and --cache-db go together")
        driver.connections.connect(options.mongo_url, options.queue_db, options.cache_db)
    try:
        if options.serve:
            for line in sys.stdin:
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                except ValueError as error:
                    answer({"ok": False, "error": describe_error(error)})
                    continue
                answer(driver.handle(request))
            return 0
        text = options.requests if options.requests not in (None, "-") else sys.stdin.read()
        requests = json.loads(text)
        if isinstance(requests, list):
            results = [driver.handle(request) for request in requests]
            answer(results)
            return 0 if all(result["ok"] for result in results) else 1
        result = driver.handle(requests)
        answer(result)
        return 0 if result["ok"] else 1
    finally:
        driver.connections.close()


if __name__ == "__main__":
    sys.exit(main())
