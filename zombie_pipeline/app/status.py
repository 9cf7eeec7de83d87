"""``zombie-pipeline status``: how the queue is doing, from the databases and the audit trail, in a second or two.

What an operator on a shell asks first: the started jobs by age against the policy, the zombies a cleanup would
finalize now, the last cleanups and what they finalized by cause, the quarantines, how long the dead jobs of the
last day waited for their release, the late results of the last day, the retries waiting and the pipeline's failures.

Every read is bounded by an index, whatever the history holds: the started and waiting jobs on
``(status, started_at)`` (the detection query itself for the zombies), the audit trail on ``finalized_at`` over
its last days, the quarantines and delayed retries on theirs. Nothing is written, and no Dagster is loaded.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from zombie_pipeline.cleanup.brake import Brake
from zombie_pipeline.cleanup.causes import cause_of_event
from zombie_pipeline.cleanup.detection import detect, started_filter
from zombie_pipeline.cleanup.quarantine import quarantine_row
from zombie_pipeline.messages import counted, plural
from zombie_pipeline.policy import ZombiePolicy
from zombie_pipeline.queue.audit_documents import Event, Failure, LateResult
from zombie_pipeline.queue.indexes import on_index
from zombie_pipeline.queue.jobs import ID, Job, Status
from zombie_pipeline.queue.reasons import CAUSES, REASONS
from zombie_pipeline.queue.store import Store, aggregate_rows
from zombie_pipeline.queue.times import as_utc, utc
from zombie_pipeline.trail import (
    active_quarantines,
    finalized_between,
    finalized_events,
    pending_retries,
    unfinished_finalizations,
)

#: The last cleanups listed, from the audit trail of this many days (a cleanup that finalized nothing leaves no event).
CLEANUPS_SHOWN = 5
CLEANUPS_DAYS = 7
#: What "the last day" is, for the release lag, the late results and the failures.
LAST_DAY = dt.timedelta(days=1)
#: The per-event times of the last day's finalizations the status reports, by the event's field. The watcher's
#: release lag (the seconds from a dead job's deadline to its release) joins them as one more entry.
TIMES = {Event.DETECTION_SECONDS: "detection (last sign of life to finalization)"}
#: Late results listed one by one (the rest are counted).
LATE_SHOWN = 10


def queue_status(store: Store, policy: ZombiePolicy, now: dt.datetime, where: Mapping[str, str]) -> dict[str, Any]:
    """The status as JSON-ready values (``--json`` prints it as it is; the text is made from it)."""
    detection = detect(store.jobs, policy, now)
    started = _started_by_type(store, policy, now)
    total_started = sum(row["started"] for row in started)
    brake = Brake(len(detection.candidates), total_started, policy.max_stale_fraction, policy.min_started_for_brake)
    since = now - LAST_DAY
    return {
        "at": now.isoformat(),
        "databases": dict(where),
        "policy": {
            "heartbeat_timeout_seconds": policy.heartbeat_timeout_seconds,
            "max_duration_seconds": policy.max_duration_seconds,
            "max_duration_seconds_by_type": dict(policy.max_duration_seconds_by_type),
        },
        "started": {
            "total": total_started,
            "waiting": store.jobs.count_documents({Job.STATUS: Status.WAITING}),
            "by_type": started,
        },
        "zombies": {
            "total": len(detection.candidates),
            "by_reason": {str(reason): count for reason, count in sorted(detection.count_by("reason").items())},
            "by_type": dict(sorted(detection.count_by("job_type").items())),
            "malformed": len(detection.malformed),
            "brake": {**brake.facts(), "engaged": brake.engaged},
        },
        "cleanups": _last_cleanups(store, now - dt.timedelta(days=CLEANUPS_DAYS), now),
        "quarantines": [quarantine_row(quarantine) for quarantine in active_quarantines(store, now)],
        "last_day": {
            "since": since.isoformat(),
            **_finalized_times(store, since, now),
            "late_results": _late_results(store, policy, since, now),
            "pipeline_failures": _failures(store, since),
        },
        "retries_waiting_for_their_delay": pending_retries(store),
        "unfinished_finalizations": unfinished_finalizations(store),
    }


def _started_by_type(store: Store, policy: ZombiePolicy, now: dt.datetime) -> list[dict[str, Any]]:
    """Per job type, the started jobs by age against its maximum duration (T2), and those silent for longer than the
    heartbeat timeout: one projected read of the started jobs (as many as the deployment has workers)."""
    fields = {Job.TYPE: 1, Job.STARTED_AT: 1, Job.LAST_HEARTBEAT: 1, Job.TERMINATED_AT: 1, ID: 0}
    rows: dict[Any, Counter[str]] = defaultdict(Counter)
    oldest: dict[Any, float] = {}
    for job in store.jobs.find(started_filter(), fields):
        job_type, started_at = job.get(Job.TYPE), as_utc(job.get(Job.STARTED_AT))
        if not isinstance(job_type, str) or started_at is None:
            job_type = "(malformed)"
        row = rows[job_type]
        row["started"] += 1
        if started_at is None:
            continue
        age = (now - started_at).total_seconds()
        oldest[job_type] = max(oldest.get(job_type, 0.0), age)
        t2 = policy.max_duration_of(job_type)
        row["past_t2" if age > t2 else "past_half_t2" if age > t2 / 2 else "under_half_t2"] += 1
        last_sign = max(moment for moment in (started_at, as_utc(job.get(Job.LAST_HEARTBEAT))) if moment is not None)
        if (now - last_sign).total_seconds() > policy.heartbeat_timeout_seconds:
            row["silent"] += 1
        if job.get(Job.TERMINATED_AT) is not None:
            row["terminated"] += 1
    return [
        {
            "type": job_type,
            "started": row["started"],
            "under_half_t2": row["under_half_t2"],
            "past_half_t2": row["past_half_t2"],
            "past_t2": row["past_t2"],
            "silent": row["silent"],
            "terminated": row["terminated"],
            "oldest_seconds": round(oldest.get(job_type, 0.0)),
            "t2_seconds": policy.max_duration_of(job_type),
        }
        for job_type, row in sorted(rows.items())
    ]


def _last_cleanups(store: Store, since: dt.datetime, now: dt.datetime) -> list[dict[str, Any]]:
    """The runs that finalized zombies lately, the latest first: grouped on the server by run, cause and reason."""
    pipeline = on_index(
        finalized_between(since, now),
        {},
        {
            "$group": {
                ID: {"run": f"${Event.RUN_ID}", "cause": f"${Event.CAUSE}", "reason": f"${Event.REASON}"},
                "count": {"$sum": 1},
                "first": {"$min": f"${Event.FINALIZED_AT}"},
                "last": {"$max": f"${Event.FINALIZED_AT}"},
                "late": {"$sum": {"$cond": [{"$eq": [{"$ifNull": [f"${Event.LATE_RESULT}", None]}, None]}, 0, 1]}},
            }
        },
    )
    runs: dict[str, dict[str, Any]] = {}
    for group in aggregate_rows(store.events, pipeline):
        key = group[ID]
        if not isinstance(key.get("run"), str) or key.get("reason") not in REASONS:
            continue
        run = runs.setdefault(
            key["run"], {"run_id": key["run"], "first": group["first"], "last": group["last"], "finalized": 0}
        )
        run["first"], run["last"] = min(run["first"], group["first"]), max(run["last"], group["last"])
        run["finalized"] += group["count"]
        cause = str(cause_of_event({Event.CAUSE: key.get("cause"), Event.REASON: key["reason"]}))
        run.setdefault("by_cause", Counter())[cause] += group["count"]
        run["late_results"] = run.get("late_results", 0) + group["late"]
    latest = sorted(runs.values(), key=lambda run: run["last"], reverse=True)[:CLEANUPS_SHOWN]
    return [
        {
            **run,
            "first": utc(run["first"]).isoformat(),
            "last": utc(run["last"]).isoformat(),
            "by_cause": {cause: run["by_cause"][cause] for cause in map(str, CAUSES) if run["by_cause"][cause]},
        }
        for run in latest
    ]


def _finalized_times(store: Store, since: dt.datetime, now: dt.datetime) -> dict[str, Any]:
    """The zombies finalized since ``since``, and each of :data:`TIMES` over them (all, and by cause)."""
    fields = {Event.CAUSE: 1, Event.REASON: 1, **dict.fromkeys(TIMES, 1)}
    events: list[dict[str, Any]] = [dict(event) for event in finalized_events(store.events, since, now, fields)]
    by_cause = Counter(str(cause_of_event(event)) for event in events if event.get(Event.REASON) in REASONS)
    times = {}
    for name, meaning in TIMES.items():
        values = [float(event[name]) for event in events if isinstance(event.get(name), (int, float))]
        causes: dict[str, list[float]] = defaultdict(list)
        for event in events:
            if isinstance(event.get(name), (int, float)) and event.get(Event.REASON) in REASONS:
                causes[str(cause_of_event(event))].append(float(event[name]))
        times[name] = {
            "meaning": meaning,
            **_spread(values),
            "by_cause": {cause: _spread(causes[cause]) for cause in map(str, CAUSES) if causes[cause]},
        }
    return {"finalized": len(events), "finalized_by_cause": dict(sorted(by_cause.items())), "times": times}


def _spread(values: Sequence[float]) -> dict[str, Any]:
    """How many, the median, the 90th percentile and the largest (nearest rank), in whole seconds."""
    if not values:
        return {"count": 0, "p50": None, "p90": None, "max": None}
    ordered = sorted(values)

    def rank(share: float) -> int:
        return round(ordered[max(math.ceil(share * len(ordered)) - 1, 0)])

    return {"count": len(ordered), "p50": rank(0.5), "p90": rank(0.9), "max": round(ordered[-1])}


def _late_results(store: Store, policy: ZombiePolicy, since: dt.datetime, now: dt.datetime) -> dict[str, Any]:
    """The finalized jobs seen alive in the last day: among the zombies finalized within the late-result window
    before it, on the ``finalized_at`` index."""
    window = finalized_between(since - dt.timedelta(hours=policy.late_result_window_hours), now)
    query = {**window, Event.LATE_RESULT: {"$ne": None}}
    fields = {f"{Event.JOB}.{Job.TYPE}": 1, f"{Event.JOB}.{Job.DATASET}": 1, Event.LATE_RESULT: 1}
    seen = []
    for event in store.events.find(query, fields).sort(Event.FINALIZED_AT, -1):
        late: Mapping[str, Any] = event.get(Event.LATE_RESULT) or {}
        seen_at = as_utc(late.get(LateResult.SEEN_AT))
        if seen_at is None or seen_at < since:
            continue
        job = event.get(Event.JOB) or {}
        seen.append(
            {
                "job_id": str(event[ID]),
                "type": job.get(Job.TYPE),
                "dataset": job.get(Job.DATASET),
                "evidence": late.get(LateResult.EVIDENCE),
                "seconds_after": late.get(LateResult.SECONDS_AFTER),
            }
        )
    return {"count": len(seen), "jobs": seen[:LATE_SHOWN]}


def _failures(store: Store, since: dt.datetime) -> dict[str, Any]:
    """The pipeline's failed runs of the last day (a small collection: one document per failed run)."""
    failed = list(store.failures.find({Failure.FAILED_AT: {"$gte": since}}).sort(Failure.FAILED_AT, -1))
    last = failed[0] if failed else None
    return {
        "count": len(failed),
        "last": None
        if last is None
        else {"run_id": str(last[ID]), "job": last.get(Failure.JOB_NAME), "message": last.get(Failure.MESSAGE)},
    }


# --- as text --------------------------------------------------------------------------------------------------


def status_text(status: Mapping[str, Any], policy_source: str) -> str:
    """The status as an operator reads it on a shell."""
    at = dt.datetime.fromisoformat(status["at"])
    lines = [
        f"queue status at {at:%Y-%m-%d %H:%M:%S} UTC; queue: {status['databases']['queue']}; "
        f"cache: {status['databases']['cache']}",
        f"policy: {policy_source}; heartbeat timeout {status['policy']['heartbeat_timeout_seconds']} s, "
        f"T2 {status['policy']['max_duration_seconds']} s"
        + _overrides(status["policy"]["max_duration_seconds_by_type"]),
        "",
    ]
    lines += _started_text(status["started"], status["policy"]["heartbeat_timeout_seconds"])
    lines += [""] + _zombies_text(status["zombies"])
    lines += [""] + _cleanups_text(status["cleanups"])
    lines += [""] + _quarantines_text(status["quarantines"])
    lines += [""] + _last_day_text(status["last_day"])
    waiting, unfinished = status["retries_waiting_for_their_delay"], status["unfinished_finalizations"]
    lines += [
        f"{counted(waiting, 'retry')} waiting for {plural(waiting, 'its', 'their')} delay; "
        f"{counted(unfinished, 'unfinished finalization')} (the next cleanup completes "
        f"{plural(unfinished, 'it', 'them')})"
    ]
    return "\n".join(lines)


def _overrides(by_type: Mapping[str, int]) -> str:
    return f" ({', '.join(f'{job_type} {seconds} s' for job_type, seconds in by_type.items())})" if by_type else ""


def _started_text(started: Mapping[str, Any], timeout: int) -> list[str]:
    lines = [
        f"started jobs: {started['total']}, waiting: {started['waiting']}; by age against their type's maximum duration "
        f"(T2), and silent for more than the heartbeat timeout ({timeout} s):"
    ]
    if not started["by_type"]:
        return lines
    header = ("type", "started", "<T2/2", "T2/2-T2", ">T2", "silent", "oldest", "T2")
    rows = [
        (
            row["type"],
            row["started"],
            row["under_half_t2"],
            row["past_half_t2"],
            row["past_t2"],
            row["silent"],
            _duration(row["oldest_seconds"]),
            f"{row['t2_seconds']} s",
        )
        for row in started["by_type"]
    ]
    return lines + _table(header, rows)


def _zombies_text(zombies: Mapping[str, Any]) -> list[str]:
    total, brake = zombies["total"], zombies["brake"]
    reasons = ", ".join(f"{count} {reason.replace('_', ' ')}" for reason, count in zombies["by_reason"].items())
    line = f"zombies now: {total}" + (f" ({reasons})" if reasons else "")
    if total:
        line += "; the next cleanup finalizes " + plural(total, "it", "them")
        if brake["engaged"]:
            line += (
                f" only with override_brake: the brake holds it back ({brake['stale']} of {brake['started']} started "
                f"jobs look dead, more than max_stale_fraction={brake['max_stale_fraction']:g})"
            )
    if zombies["malformed"]:
        line += f"; {counted(zombies['malformed'], 'malformed started job')} left alone"
    return [line]


def _cleanups_text(cleanups: Sequence[Mapping[str, Any]]) -> list[str]:
    if not cleanups:
        return [f"last cleanups: none finalized a zombie in the last {CLEANUPS_DAYS} days (zombieEvents)"]
    lines = [f"last cleanups that finalized zombies (zombieEvents, last {CLEANUPS_DAYS} days), latest first:"]
    for run in cleanups:
        causes = ", ".join(f"{count} {cause.replace('_', ' ')}" for cause, count in run["by_cause"].items())
        late = f"; {counted(run['late_results'], 'late result')}" if run["late_results"] else ""
        at = dt.datetime.fromisoformat(run["last"])
        lines.append(f"  {at:%Y-%m-%d %H:%M} UTC  run {run['run_id']}: finalized {run['finalized']} ({causes}){late}")
    return lines


def _quarantines_text(quarantines: Sequence[Mapping[str, Any]]) -> list[str]:
    if not quarantines:
        return ["quarantines: none"]
    lines = [
        f"quarantines: {len(quarantines)} (not re-enqueued; lift one with lift_quarantine_job, config dataset and "
        "job_type):"
    ]
    lines += [
        f"  {row['dataset']} {row['type']}: {row['crashes']} crashes within {row['window_hours']} h, since "
        f"{row['since']} UTC, lapses {row['lapses_at']} UTC"
        for row in quarantines
    ]
    return lines


def _last_day_text(last_day: Mapping[str, Any]) -> list[str]:
    finalized = last_day["finalized"]
    causes = ", ".join(f"{count} {cause.replace('_', ' ')}" for cause, count in last_day["finalized_by_cause"].items())
    lines = [f"last 24 h: finalized {counted(finalized, 'zombie')}" + (f" ({causes})" if causes else "")]
    for times in last_day["times"].values():
        if not times["count"]:
            continue
        by_cause = "; ".join(
            f"{cause.replace('_', ' ')} p50 {_duration(spread['p50'])}" for cause, spread in times["by_cause"].items()
        )
        lines.append(
            f"  {times['meaning']}: p50 {_duration(times['p50'])}, p90 {_duration(times['p90'])}, max "
            f"{_duration(times['max'])}" + (f" ({by_cause})" if by_cause else "")
        )
    late = last_day["late_results"]
    lines.append(f"  late results (finalized jobs seen alive afterwards): {late['count']}")
    lines += [
        f"    {item['type']} {item['dataset']}: {item['evidence']} {_duration(item['seconds_after'] or 0)} after"
        for item in late["jobs"]
    ]
    failures = last_day["pipeline_failures"]
    line = f"  pipeline failures (zombiePipelineFailures): {failures['count']}"
    if failures["last"]:
        line += f"; the last, {failures['last']['job']}: {failures['last']['message']}"
    return [*lines, line]


def _duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``3 h 05``: seconds as an operator reads them."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7_200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds // 3_600:.0f} h {seconds % 3_600 // 60:02.0f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    return [
        "  "
        + "  ".join(
            str(cell).ljust(width) if index == 0 else str(cell).rjust(width)
            for index, (cell, width) in enumerate(zip(line, widths, strict=True))
        )
        for line in (header, *rows)
    ]
