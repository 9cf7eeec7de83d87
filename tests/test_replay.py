"""The detection replay (issue 29): the deployment's killer on hand-made cases, detection time measured from the
true death, and a small replay of the real cleanup on the suite's server. The week-long replay and its figures
are ``python -m benchmarks.run --only detection``, never a test."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` is not an installed package

from benchmarks.replay_cleanup import PipelineSettings, RunStart, replay_pipeline  # noqa: E402
from benchmarks.replay_deployment import DeploymentSettings, replay_deployment  # noqa: E402
from benchmarks.replay_figures import DEATHS, figures  # noqa: E402
from benchmarks.replay_trace import (  # noqa: E402
    Actor,
    Beats,
    Cause,
    Checks,
    Fate,
    Finalization,
    Job,
    Outcome,
    Trace,
    TraceSettings,
    constant,
    generate,
    lifecycle,
)
from zombie_pipeline.queue import documents  # noqa: E402
from zombie_pipeline.queue.documents import Reason, RetryOutcome  # noqa: E402

#: A pass reads at once and finishes each stuck job 0.05 s after the previous one: easy arithmetic.
INSTANT = DeploymentSettings(read_seconds=0.0, read_seconds_per_started_job=0.0, finish_seconds=0.05)
SETTINGS = TraceSettings(days=1.0, tail_hours=0.0)


def job(
    index: int,
    fate: Fate,
    natural_end: float,
    beats: list[float],
    checks: list[float] = (),  # type: ignore[assignment]
    start: float = 0.0,
    sigterm_at: float | None = None,
    onset: float | None = None,
) -> Job:
    return Job(
        index=index,
        job_type="/first-rows",
        dataset=f"user/dataset-{index}",
        config="default",
        split="train",
        revision="abc",
        difficulty=70,
        created=start,
        start=start,
        pod=index,
        fate=fate,
        natural_end=natural_end,
        beats=Beats(0, start, SETTINGS, times=beats),
        checks=Checks(0, start, SETTINGS, times=list(checks)),
        onset=onset,
        sigterm_at=sigterm_at,
        sigterm_kill=None if sigterm_at is None else sigterm_at + SETTINGS.grace_seconds,
    )


def trace_of(*jobs: Job) -> Trace:
    return Trace(SETTINGS, list(jobs), pods=[], waves=[], fleet_minutes=[50] * 1_441)


def every_minute(start: float, until: float) -> list[float]:
    return [start + 60.0 * k for k in range(1, int((until - start) // 60) + 1)]


def test_a_job_whose_heartbeat_stopped_is_killed_by_the_first_pass_after_five_minutes_and_timed_from_its_death():
    crashed = job(0, Fate.CRASH, natural_end=1_000.0, beats=every_minute(0, 1_000))  # last beat at 960
    trace = trace_of(crashed)
    passes = [(1_200.0, 1), (1_259.0, 2), (1_262.0, 3), (1_300.0, 4)]  # 240 s, 299 s, 302 s after the last beat

    outcome = replay_deployment(trace, INSTANT, passes)

    assert [(f.at, f.actor, f.reason) for f in outcome.finalizations[0]] == [
        (1_262.05, Actor.KILL_STUCK, Reason.MISSING_HEARTBEAT)
    ]
    crash = figures(trace, outcome)["detection"]["crash"]
    # from the true death (1000), neither from the last heartbeat (960) nor from when the rule could first fire (1260)
    assert crash["zombies"] == 1 and crash["max"] == pytest.approx(262.05)


def test_a_job_that_never_heartbeated_is_timed_from_its_death_not_its_start():
    never = job(0, Fate.NEVER_STARTED, natural_end=20.0, beats=[])
    outcome = replay_deployment(trace_of(never), INSTANT, [(299.0, 1), (301.0, 2)])

    assert [(f.at, f.reason) for f in outcome.finalizations[0]] == [(301.05, Reason.NEVER_HEARTBEATED)]
    assert figures(trace_of(never), outcome)["detection"]["never_started"]["max"] == pytest.approx(281.05)


def test_a_terminated_job_is_killed_five_minutes_after_its_sigterm_whatever_its_heartbeats():
    # SIGTERMed at 2000, killed at 2030 (grace); its executor beat every minute until then
    terminated = job(0, Fate.HEALTHY, natural_end=5_000.0, beats=every_minute(0, 2_030), sigterm_at=2_000.0)
    trace = trace_of(terminated)
    assert lifecycle(terminated, constant(2_400)).cause is Cause.SIGTERM

    outcome = replay_deployment(trace, INSTANT, [(2_250.0, 1), (2_299.0, 2), (2_301.0, 3)])

    assert [(f.at, f.reason) for f in outcome.finalizations[0]] == [(2_301.05, Reason.TERMINATED)]
    assert figures(trace, outcome)["detection"]["sigterm"]["max"] == pytest.approx(271.05)  # from its kill at 2030


def test_the_deployment_spends_a_run_on_every_sigterm_death_it_finalizes_and_tells_no_cause():
    # SIGTERMed at 2000 and killed at 2030 with its pod (a deploy wave); a worker that crashed alone at 1000
    terminated = job(0, Fate.HEALTHY, natural_end=5_000.0, beats=every_minute(0, 2_030), sigterm_at=2_000.0)
    crashed = job(1, Fate.CRASH, natural_end=1_000.0, beats=every_minute(0, 1_000))
    trace = trace_of(terminated, crashed)

    causes = figures(trace, replay_deployment(trace, INSTANT, [(2_301.0, 1)]))["causes"]

    assert causes["finalized"] == {"crash": 2}  # every dead job is a JobManagerCrashedError to it
    assert causes["told_by_true_cause"] == {"sigterm": {"crash": 1}, "crash": {"crash": 1}}
    assert causes["runs_spent_on_deploy_deaths"] == 1 and causes["retries"] == {}  # its backfill re-runs them


def test_a_long_job_is_stopped_at_2400_seconds_by_its_own_worker_and_never_judged_stuck():
    long_job = job(0, Fate.HEALTHY, natural_end=3_000.0, beats=every_minute(0, 3_000), checks=[2_350, 2_399, 2_420])
    trace = trace_of(long_job)
    passes = [(float(t), 1) for t in range(0, 3_000, 10)]  # a large fleet: a pass every 10 s

    outcome = replay_deployment(trace, INSTANT, passes)

    assert [(f.at, f.actor, f.reason) for f in outcome.finalizations[0]] == [
        (2_420.0, Actor.KILL_LONG, Reason.EXCEEDED_MAX_DURATION)
    ]
    mistakes = figures(trace, outcome)["mistakes"]
    assert mistakes["healthy_stopped_by_t2"] == 1 and mistakes["live_finalized"] == 0


@pytest.mark.parametrize(("retry", "twice"), [(RetryOutcome.ENQUEUED, 1), (None, 0)])
def test_a_live_job_finalized_as_overdue_and_re_enqueued_at_once_runs_twice_at_once(retry, twice):
    """A T2 below the executor's own: the cleanup frees the job at 1,500 s while its process runs to its kill at
    2,420 s; a timeout it re-runs at once can start beside it, one left to the deployment is never re-run."""
    long_job = job(0, Fate.HEALTHY, natural_end=3_000.0, beats=every_minute(0, 3_000), checks=[2_350, 2_399, 2_420])
    trace = trace_of(long_job)
    outcome = Outcome("c", constant(2_400.0))
    outcome.add(0, Finalization(1_500.0, Actor.CLEANUP, Reason.EXCEEDED_MAX_DURATION, documents.Cause.TIMEOUT, retry))

    mistakes = figures(trace, outcome)["mistakes"]

    assert (mistakes["freed_while_running"], mistakes["run_twice_at_once"], mistakes["live_finalized"]) == (1, twice, 0)


def test_a_four_minute_heartbeat_gap_is_not_a_death():
    beats = [60.0, 120.0, 360.0, 420.0, 660.0, 720.0]  # 240 s gaps: a GC pause, slow I/O
    alive = job(0, Fate.HEALTHY, natural_end=750.0, beats=beats)
    outcome = replay_deployment(trace_of(alive), INSTANT, [(float(t), 1) for t in range(0, 750, 5)])
    assert outcome.finalizations == {}


def test_two_passes_reading_a_stuck_job_before_either_deletes_it_both_finalize_it():
    crashed = [job(i, Fate.CRASH, natural_end=100.0, beats=[60.0]) for i in range(2)]
    trace = trace_of(*crashed)
    # the first pass finishes its two jobs at 400.05 and 400.10; the second read them at 400.07
    outcome = replay_deployment(trace, INSTANT, [(400.0, 1), (400.07, 2), (401.0, 3)])

    assert [len(outcome.finalizations[i]) for i in range(2)] == [1, 2]
    assert outcome.counts["judged_by_two_passes_at_once"] == 1
    assert figures(trace, outcome)["mistakes"]["finalized_twice_by_one_killer"] == 1


def test_a_small_replay_of_the_real_cleanup(mongo_url: str):
    """Six hours (a deploy wave among them) against the cleanup on the suite's server, beside the deployment's model."""
    settings = TraceSettings(days=0.2, tail_hours=1.0, jobs=400, deploy_waves=1, deploy_hours=(2.0, 4.0))
    trace = generate(settings)
    chart_max = constant(settings.chart_max_duration_seconds)
    zombies = {j.index: lifecycle(j, chart_max) for j in trace.jobs if lifecycle(j, chart_max).cause is not None}
    assert trace.waves and {life.cause for life in zombies.values()} >= {Cause.CRASH, Cause.SIGTERM}

    pipeline = PipelineSettings("c", "sensor", sensor_tick_seconds=60.0, run_start=RunStart(20.0, 30.0, 103.0))
    deployment, cleanup = (
        replay_deployment(trace),
        replay_pipeline(trace, pipeline, mongo_url, "test_replay_q", "test_replay_c"),
    )

    for outcome in (deployment, cleanup):
        row = figures(trace, outcome)
        assert all(row["detection"][cause.value]["unfinalized"] == 0 for cause in DEATHS)  # a late hang may not be
        assert row["mistakes"]["live_finalized"] == 0 and row["mistakes"]["finalized_twice_by_one_killer"] == 0
    policy = pipeline.policy(per_type=False)
    for index, life in zombies.items():
        if life.cause is Cause.HANG:
            continue
        first = min(cleanup.finalizations[index], key=lambda f: f.at)
        job_ = trace.jobs[index]
        if first.actor is Actor.CLEANUP:
            # its find came after the timeout since the last sign of life (finalize is 1 s after find); and at most
            # a tick, then a run in flight and its own run (each a start of at most 103 s and 5 s of steps) later
            # (a SIGTERMed job: the deployment's rule, 300 s after the signal, or the SIGTERM rule's grace with its
            # heartbeats stopped two intervals earlier, whichever comes first)
            last_beat = job_.beats.last_before(life.process_end)
            last_sign = last_beat if last_beat is not None else job_.start
            due = last_sign + policy.heartbeat_timeout_seconds
            if life.cause is Cause.SIGTERM:
                assert job_.sigterm_at is not None and policy.termination_grace_seconds is not None
                fast = max(
                    job_.sigterm_at + policy.termination_grace_seconds, last_sign + policy.termination_silence_seconds()
                )
                due = min(job_.sigterm_at + policy.heartbeat_timeout_seconds, fast)
            assert life.zombie_since is not None and last_sign <= life.zombie_since
            assert due + 1 <= first.at <= due + 60 + 2 * (103 + 5)
    assert cleanup.counts["runs_by_sensor"] > 0 and cleanup.counts["brake_engaged"] == 0
    assert not math.isnan(figures(trace, cleanup)["deaths"]["p99"])
    # issue 30: every SIGTERMed job the cleanup finalized is a deploy death, re-enqueued at once, and costs no run;
    # the deployment spent one on each it finalized
    ours, theirs = figures(trace, cleanup)["causes"], figures(trace, deployment)["causes"]
    assert set(ours["told_by_true_cause"]["sigterm"]) == {"deploy"}
    assert ours["finalized"]["deploy"] > 0 and set(ours["retries"]["deploy"]) <= {"enqueued", "already_queued"}
    assert ours["runs_spent_on_deploy_deaths"] == 0 < theirs["runs_spent_on_deploy_deaths"]
    assert theirs["runs_spent_on_deploy_deaths"] >= sum(theirs["told_by_true_cause"]["sigterm"].values())
