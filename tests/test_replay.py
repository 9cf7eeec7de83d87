"""The detection replay (issues 29, 35): the chart's fleet on hand-made cases, the killers' rules, mistakes counted
from the trace's truth, and the rules model against the real cleanup on the suite's server. The figures over many
seeds are ``python -m benchmarks.run --only detection``, never a test."""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `benchmarks` is not an installed package

from benchmarks.replay.contenders import Contender, replay, rule_spans  # noqa: E402
from benchmarks.replay.database import DatabaseCleanup, compare, prepare_queue  # noqa: E402
from benchmarks.replay.deployment import DeploymentSettings, pass_times  # noqa: E402
from benchmarks.replay.figures import seed_record  # noqa: E402
from benchmarks.replay.fleet import INCIDENT_POOLS, Pool, desired_pods, scale_down_choice  # noqa: E402
from benchmarks.replay.generate import TraceSettings, generate  # noqa: E402
from benchmarks.replay.latency import ReleaseLag, StartLatency, release_lag  # noqa: E402
from benchmarks.replay.rules import Rule  # noqa: E402
from benchmarks.replay.section import ReplaySettings, _described, recorded_witness  # noqa: E402
from benchmarks.replay.trace import Actor, Beats, Checks, Fate, Job, Pod, Trace, constant, lifecycle  # noqa: E402
from zombie_pipeline.cleanup import run  # noqa: E402
from zombie_pipeline.policy import ZombiePolicy  # noqa: E402
from zombie_pipeline.queue.reasons import Reason  # noqa: E402
from zombie_pipeline.queue.store import Store  # noqa: E402

KILLER = Contender("a", "killer", killer=True, deployment=DeploymentSettings(read_seconds=0.0,
                   read_seconds_per_started_job=0.0, finish_seconds=0.05))  # fmt: skip
POLICY = ZombiePolicy(max_duration_seconds=2520)
WATCHER = Contender("w", "watcher", watcher=True, policy=POLICY, lag=ReleaseLag(samples=(1.0,)))
ONE_POOL = Pool("light", 2, 10, 10, 30.0, (0, 100), 0.25, 30.0, 30.0)  # always more work than pods


def every_minute(start: float, until: float) -> list[float]:
    return [start + 60.0 * k for k in range(1, int((until - start) // 60) + 1)]


def job(index: int, fate: Fate, natural_end: float, beats: list[float], sigterm_at: float | None = None) -> Job:
    return Job(index, "/first-rows", f"user/dataset-{index}", "default", "train", "abc", 70, 0.0, 0.0, index, fate,
               natural_end, Beats.at(beats), Checks.at([]), sigterm_at=sigterm_at,
               sigterm_kill=None if sigterm_at is None else sigterm_at + 30.0)  # fmt: skip


def trace_of(*jobs: Job) -> Trace:
    return Trace(None, list(jobs), pods=[Pod(0, "light", 0.0)], deploys=[], fleet_minutes={0: 50}, horizon=10_000.0)


def run_one(trace: Trace, contender: Contender, passes: list[tuple[float, int]] | None = None):
    lives = [lifecycle(j, contender.kill_long) for j in trace.jobs]
    spans = {
        "deployment": rule_spans(trace, lives, Rule.deployment()),
        "cleanup": rule_spans(trace, lives, Rule.of_policy(POLICY)),
    }
    outcome = replay(trace, contender, lives, spans, 1, passes=passes)
    return outcome, seed_record(trace, outcome, 1)


# --- the fleet ---------------------------------------------------------------------------------------------


def test_a_pool_moves_by_one_pod_a_minute_toward_what_its_backlog_asks():
    heavy = Pool("heavy", 4, 40, 50, 120.0, (70, 100))
    assert desired_pods(heavy, 4, 500) == 5  # ten times the target: one more pod, not 40
    assert desired_pods(heavy, 20, 10) == 19  # far below: one fewer
    assert desired_pods(heavy, 20, 52) == 20  # within Kubernetes' 10 % tolerance
    assert desired_pods(heavy, 40, 10_000) == 40 and desired_pods(heavy, 4, 0) == 4  # the chart's range


def test_a_pool_with_a_backlog_grows_from_its_minimum_to_its_maximum_one_pod_a_minute():
    trace = generate(TraceSettings(seed=5, pools=(ONE_POOL,), days=0.05, warmup_hours=0.0, tail_hours=0.0,
                                   deploys_per_day=0.0))  # fmt: skip
    sizes = [trace.fleet_minutes[m] for m in sorted(trace.fleet_minutes)]
    grown = next(m for m, size in enumerate(sizes) if size >= ONE_POOL.max_pods)
    # the metric is 0 until its first refresh (10 min), then one pod a minute, each up 20-60 s after it is asked for
    assert sizes[0] == ONE_POOL.min_pods
    assert ONE_POOL.max_pods - ONE_POOL.min_pods <= grown <= ONE_POOL.max_pods - ONE_POOL.min_pods + 12
    assert all(later - earlier <= 1 for earlier, later in zip(sizes[:grown], sizes[1 : grown + 1], strict=True))


def test_scale_down_takes_the_youngest_pods_busy_or_not():
    rng = random.Random(1)
    ready_since = [0.0, 100.0, 3_100.0, 3_400.0]  # the last two ready 600 and 900 s ago: the youngest bucket (2^9)
    picks = {scale_down_choice(ready_since, 4_000.0, rng) for _ in range(50)}
    assert picks == {2, 3}


def test_scale_down_sigterms_busy_pods_without_any_deploy():
    settings = TraceSettings(seed=3, deploys_per_day=0.0, days=0.3, warmup_hours=0.5)
    trace = generate(replace(settings, pools=(replace(ONE_POOL, peak_load_pods=30.0, night_load_pods=1.0),)))
    # from midnight the load falls to the night's: the HPA removes pods, some of them running a job
    assert not trace.deploys and any(j.sigterm_at is not None for j in trace.jobs)


def test_a_rolling_deploy_takes_a_quarter_of_the_pods_at_a_time_and_the_old_ones_keep_passing():
    pool = replace(ONE_POOL, min_pods=8, max_pods=8, peak_load_pods=4.0, night_load_pods=4.0)
    settings = TraceSettings(seed=2, pools=(pool,), days=0.5, warmup_hours=0.0, tail_hours=0.5, deploys_per_day=1.0,
                             deploy_hours=(2.0, 3.0))  # fmt: skip
    trace = next(t for t in (generate(replace(settings, seed=s)) for s in range(1, 20)) if t.deploys)
    deploy = trace.deploys[0]
    old = [p for p in trace.pods if p.start < deploy and p.sigterm_at is not None and p.sigterm_at >= deploy]
    batches = sorted({round(p.sigterm_at or 0.0, 3) for p in old})
    assert len(old) >= 7 and len(batches) >= 4  # 8 pods, 2 at a time (25 %, maxSurge 0)
    assert all(sum(1 for p in old if round(p.sigterm_at or 0.0, 3) == b) <= 2 for b in batches)
    last_batch = batches[-1]
    passes_of_old = [at for at, pod in pass_times(trace, DeploymentSettings(), 1) if any(p.index == pod for p in old)]
    assert any(deploy < at < last_batch for at in passes_of_old)  # the pods not rolled yet still pass


def test_a_recreated_pool_loses_every_pod_at_once_and_its_jobs_get_the_pools_grace():
    settings = TraceSettings(seed=4, days=0.6, warmup_hours=1.0, tail_hours=0.5, deploys_per_day=1.0,
                             deploy_hours=(10.0, 11.0))  # fmt: skip
    trace = next(t for t in (generate(replace(settings, seed=s)) for s in range(4, 30)) if t.deploys)
    deploy = trace.deploys[0]
    medium = [p for p in trace.pods if p.pool == "medium" and p.start < deploy < p.end]
    assert medium and all(p.sigterm_at == deploy for p in medium)
    graces = {round((j.sigterm_kill or 0) - (j.sigterm_at or 0)) for j in trace.jobs if j.sigterm_at == deploy}
    assert graces <= {120, 60, 30} and 60 in graces


# --- beats and rules -----------------------------------------------------------------------------------------


def test_a_pause_of_the_executor_holds_back_the_beat_due_during_it():
    beats = Beats(10.0, 60.0, [(100.0, 400.0)])  # beats at 10, 70, then the one due at 130 comes at 500
    assert beats.last_before(499.0) == 70.0 and beats.last_before(500.0) == 500.0 and beats.last_before(561.0) == 560.0
    assert beats.silences(1_000.0)[0] == (70.0, 500.0)


def test_a_job_whose_heartbeat_stopped_is_killed_by_the_first_pass_after_five_minutes_and_timed_from_its_death():
    crashed = job(0, Fate.CRASH, 1_000.0, every_minute(0, 1_000))  # last beat at 960
    passes = [(1_200.0, 0), (1_259.0, 0), (1_262.0, 0), (1_300.0, 0)]
    outcome, record = run_one(trace_of(crashed), KILLER, passes)
    assert [(f.at, f.actor, f.reason) for f in outcome.finalizations[0]] == [
        (1_262.05, Actor.KILL_STUCK, Reason.MISSING_HEARTBEAT)
    ]
    assert record.detection.tolist() == [pytest.approx(262.05)]  # from the death at 1000, not the last beat


def test_a_gap_past_the_threshold_finalizes_a_live_job_and_counts_as_a_mistake():
    """A pause of 400 s in a live job's heartbeats (a GC pause, a starved loop): whoever acts inside the gap
    finalizes a live job, and its result comes late."""
    beats = [*every_minute(0, 600), 1_000.0, *every_minute(1_000, 1_500)]  # silent from 600 to 1000
    alive = job(0, Fate.HEALTHY, 1_500.0, beats)
    for contender, passes in ((KILLER, [(950.0, 0)]), (WATCHER, None)):
        outcome, record = run_one(trace_of(alive), contender, passes)
        assert outcome.finalizations[0][0].at < 1_000.0
        assert record.mistakes["live_finalized"] == 1 and record.mistakes["late_results"] == 1
    quiet_killer, record = run_one(trace_of(alive), KILLER, [(800.0, 0), (1_100.0, 0)])  # its passes miss the gap
    assert quiet_killer.finalizations == {} and record.mistakes["live_finalized"] == 0


def test_the_sigterm_rule_frees_a_terminated_job_once_its_grace_passed_and_its_beats_stopped():
    terminated = job(0, Fate.HEALTHY, 5_000.0, every_minute(0, 2_030), sigterm_at=2_000.0)  # killed at 2030
    life = lifecycle(terminated, constant(2_400.0))
    ours = rule_spans(trace_of(terminated), [life], Rule.of_policy(POLICY))
    theirs = rule_spans(trace_of(terminated), [life], Rule.deployment())
    assert [(s.since, s.reason) for s, _ in ours] == [(2_120.0, Reason.TERMINATED)]  # max(2000 + 120, 1980 + 2 x 60)
    assert [(s.since, s.reason) for s, _ in theirs] == [(2_300.0, Reason.TERMINATED)]


def test_beside_the_killer_whoever_deletes_first_takes_the_job():
    crashed = job(0, Fate.CRASH, 1_000.0, every_minute(0, 1_000))
    both = replace(WATCHER, name="a+w", killer=True, deployment=KILLER.deployment)
    outcome, record = run_one(trace_of(crashed), both, [(1_261.5, 0)])  # the watcher acts at 1260 + 1 s
    assert [f.actor for f in outcome.finalizations[0]] == [Actor.WATCHER]
    outcome, _ = run_one(trace_of(crashed), both, [(1_260.5, 0)])  # the pass reads first and finishes at 1260.55
    assert [f.actor for f in outcome.finalizations[0]] == [Actor.KILL_STUCK]
    outcome, _ = run_one(trace_of(crashed), both, [(1_260.98, 0)])  # read before the watcher, finished after it
    assert [f.actor for f in outcome.finalizations[0]] == [Actor.WATCHER, Actor.KILL_STUCK]  # its cache error again


def test_the_watchers_lag_pools_the_true_lags_of_every_run_the_watch_script_measured(tmp_path: Path):
    def measured(samples: list[float], at: str) -> dict[str, object]:
        return {"conditions": {"measured_at": at, "cpu_bound_processes_beside": 0},
                "recorded_release_lag_samples_seconds": [9.0] * len(samples),  # what events said: not the truth
                "release_lag_samples_seconds": samples}  # fmt: skip

    path = tmp_path / "watch_release_lag.json"
    path.write_text(json.dumps({"timeout60_idle": measured([0.2, 0.1], "2026-12-05T08:16:12+00:00"),
                                "timeout300_idle": measured([0.4], "2026-12-05T08:29:42+00:00")}))  # fmt: skip
    lag = release_lag((0.5,), path)
    assert sorted(lag.samples) == [0.1, 0.2, 0.4]
    assert lag.draw(random.Random(1)) in lag.samples
    assert "3 samples" in lag.source and "timeout60_idle (2" in lag.source and "timeout300_idle (1" in lag.source
    modelled = release_lag((0.5,), tmp_path / "absent.json")
    assert modelled.samples == () and modelled.source.startswith("model:")


def test_a_reused_witness_is_labelled_as_the_run_that_recorded_it_and_refused_for_other_settings(tmp_path: Path):
    settings = ReplaySettings()
    described = json.loads(json.dumps(_described(settings), default=str))
    meta = {"started_at": "2026-12-05T03:29:49+00:00", "command": "python -m benchmarks.run --only detection",
            "code": {"commit": "0000000"}}  # fmt: skip
    witness = {"seed": 1, "contender": "c@local-loaded", "finalize_seconds": [0.02]}
    path = tmp_path / "benchmarks-results.json"
    path.write_text(json.dumps({"replay": {"settings": described, "witness": witness, "meta": meta}}))
    seen = recorded_witness(settings, path)
    assert seen["finalize_seconds"] == [0.02]
    assert seen["recorded_by"]["started_at"] == meta["started_at"] and seen["recorded_by"]["commit"] == "0000000"
    assert seen["recorded_by"]["cleanup_files_changed_since"] is None  # not a commit of this clone: not "unchanged"
    with pytest.raises(SystemExit, match="heartbeat_timeout_seconds"):
        recorded_witness(replace(settings, heartbeat_timeout_seconds=240), path)


# --- the real cleanup ----------------------------------------------------------------------------------------


def test_run_cleanup_asks_its_clock_for_every_step_the_audit_included(mongo_url: str):
    from benchmarks.harness import new_client

    client = new_client(mongo_url)
    try:
        store: Store = prepare_queue(client, "test_replay_clock_q", "test_replay_clock_c")
        asked = []

        def clock(step: run.Step, candidates) -> object:
            asked.append(step)
            from benchmarks.replay.trace import moment

            return moment(1_000.0 + len(asked))

        run.run_cleanup(store, POLICY, "clock-run", clock=clock)  # type: ignore[arg-type]
        assert asked == [run.Step.RECONCILE, run.Step.FIND, run.Step.FINALIZE, run.Step.AUDIT]
    finally:
        client.drop_database("test_replay_clock_q")
        client.drop_database("test_replay_clock_c")
        client.close()


def test_the_rules_model_and_the_real_cleanup_finalize_the_same_jobs_at_the_same_moments(mongo_url: str):
    settings = TraceSettings(seed=3, pools=INCIDENT_POOLS, days=0.1, warmup_hours=1.0, tail_hours=1.0,
                             deploys_per_day=12.0, deploy_hours=(0.2, 2.0))  # fmt: skip
    trace = generate(settings)
    lives = [lifecycle(j, constant(2_400.0)) for j in trace.jobs]
    spans = {"deployment": [], "cleanup": rule_spans(trace, lives, Rule.of_policy(POLICY))}
    sensor = Contender("c", "sensor", sensor=True, policy=POLICY, start=StartLatency("t", "t", (4.0, 6.0, 9.0)))
    model = replay(trace, sensor, lives, spans, 3)
    backend = DatabaseCleanup(trace, lives, POLICY, mongo_url, "test_replay_witness")
    try:
        real = replay(trace, sensor, lives, spans, 3, backend)
    finally:
        backend.close()
    found = compare(model, real)
    assert found["finalized_by_real_cleanup"] > 0 and not found["model_only"] and not found["real_only"]
    assert found["same_moment"] == found["finalized_by_model"] and found["largest_difference_seconds"] == 0.0
    assert backend.finalize_seconds and not math.isnan(sum(backend.finalize_seconds))
