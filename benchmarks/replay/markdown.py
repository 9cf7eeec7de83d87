"""The detection section of docs/benchmarks-results.md, from the section's results (:mod:`.section`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.replay.figures import CAUSES, FLEET_BINS, MISTAKES


def _e(estimate: dict[str, Any] | None, digits: int = 0) -> str:
    if not estimate or (estimate.get("n") == 0 and estimate.get("value") is None):
        return "–"

    def f(x: float | None) -> str:
        return "∞" if x is None else f"{x:,.{digits}f}"

    return f"{f(estimate['value'])} [{f(estimate['low'])}-{f(estimate['high'])}]"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def detection_table(summaries: dict[str, Any], labels: dict[str, str]) -> str:
    names = ["deaths", *(cause.value for cause in CAUSES)]
    rows = []
    for name, s in summaries.items():
        cells = [labels.get(name, name)]
        for cause in names:
            c = s["by_cause"][cause]
            n = c["p50"]["n"]
            cells.append(
                f"{_e(c['p50'])} / {_e(c['p99'])} (n={n}{', ' + str(c['unfinalized']) + ' never' if c['unfinalized'] else ''})"
            )
        rows.append(cells)
    headers = ["contender", *(f"{n.replace('_', ' ')}: p50 / p99 s" for n in names)]
    return _table(headers, rows)


def fleet_table(summaries: dict[str, Any], labels: dict[str, str]) -> str:
    rows = []
    for name, s in summaries.items():
        cells = [labels.get(name, name)]
        for bin_name, _, _ in FLEET_BINS:
            b = s["by_fleet"][bin_name]
            cells.append(f"{_e(b['p99'])} (p50 {_e(b['p50'])}, n={b['p99']['n']})")
        rows.append(cells)
    return _table(["contender", *(f"{name} pods: p99 s" for name, _, _ in FLEET_BINS)], rows)


def mistakes_table(summaries: dict[str, Any], labels: dict[str, str]) -> str:
    rows = []
    for name, s in summaries.items():
        m = s["mistakes_per_10k"]
        rows.append([labels.get(name, name), *(f"{_e(m[k], 2)} ({m[k]['n']})" for k in MISTAKES),
                     f"{s['hung_worker_hours']:.1f}", s["runs"]])  # fmt: skip
    headers = ["contender", *(k.replace("_", " ") for k in MISTAKES), "hung worker-hours", "runs"]
    return _table(headers, rows)


def finalizers_table(summaries: dict[str, Any], labels: dict[str, str]) -> str:
    rows = []
    for name, s in summaries.items():
        if not name.startswith("a+"):
            continue
        by = s["first_finalized_by"]
        total = sum(by.values()) or 1
        rows.append([labels.get(name, name), *(f"{by.get(a, 0)} ({by.get(a, 0) / total:.1%})"
                                               for a in ("cleanup", "watcher", "kill_stuck_jobs", "kill_long_job"))])  # fmt: skip
    return _table(["contender", "ours: cleanup run", "ours: watcher", "the deployment's kill_stuck_jobs",
                   "kill_long_job"], rows)  # fmt: skip


def latency_table(latencies: list[dict[str, Any]]) -> str:
    rows = []
    for latency in latencies:
        if "n" in latency:
            rows.append([latency["label"], f"p50 {latency['p50']:.1f} s, p90 {latency['p90']:.1f} s, max {latency['max']:.1f} s "
                         f"(n={latency['n']})", latency["source"]])  # fmt: skip
        else:
            rows.append([latency["label"], latency["model"], latency["source"]])
    return _table(["start latency", "queued to started", "source"], rows)


def targets_table(found: list[dict[str, Any]]) -> str:
    verdicts = {True: "**held**", False: "**missed**", None: "not measured"}
    return _table(["target", "measured (95 % interval over the seeds)", "verdict", "missed by"],
                  [[t["target"], t["measured"], verdicts[t["held"]], t["missed_by"]] for t in found])  # fmt: skip


def _recorded(recorded: dict[str, Any]) -> str:
    changed = recorded["cleanup_files_changed_since"]
    if changed is None:
        since = "whether the real cleanup's code changed since is unknown (that commit is not in this clone)"
    elif changed:
        since = (
            f"the real cleanup's code has changed since in {len(changed)} files of zombie_pipeline/cleanup and "
            f"zombie_pipeline/queue ({', '.join(Path(f).name for f in changed)}): it witnesses that commit's cleanup"
        )
    else:
        since = "the real cleanup's code (zombie_pipeline/cleanup, zombie_pipeline/queue) is unchanged since"
    return (
        f"**Recorded by the run of {recorded['started_at']} at commit {recorded['commit']}** (`{recorded['command']}`), "
        f"read from {recorded['path']}, not run again by this command; {since}."
    )


def markdown(replay: dict[str, Any], command: str) -> str:
    labels = replay["labels"]
    witness = replay.get("witness") or {}
    lat_file = replay.get("start_latency_file") or {}
    parts = [
        "## 6. Detection: the chart's fleet over many seeds (issues 29, 34, 35)",
        "",
        f"Command: `{command}` ({replay['total_seconds']:.0f} s on {replay['cpu_count']} cores shared with other "
        f"sessions, load average {replay.get('load_average_1m', '?')} at the end). {replay['seeds']} seeds of "
        f"{replay['trace']['label']}, a day each after {replay['trace']['warmup_hours']:g} h of warm-up; "
        f"{replay['incident_seeds']} seeds of a cluster incident apart. Every figure: the value over all seeds, "
        "[its 95 % bootstrap interval: seeds, then deaths within them, resampled]. A death never finalized counts "
        "as waiting forever (∞).",
        "",
        "Run start latencies (the sensor's runs run with each; the start latency file was measured "
        f"{lat_file.get('started_at', '?')}-{lat_file.get('finished_at', '?')}, load average before "
        f"{lat_file.get('load_average_before', '?')}: re-run `.venv/bin/python scripts/cleanup_start.py --distribution` "
        "on an idle host to refresh it):",
        "",
        latency_table(replay["start_latencies"]),
        "",
        f"The watcher's release lag: {replay['release_lag']['source']}.",
        "",
        "Detection time (true death to the first finalization), p50 / p99 in seconds:",
        "",
        detection_table(replay["contenders"], labels),
        "",
        "p99 of deaths (crash, SIGTERM, never started) by the fleet's size at the death (all pools):",
        "",
        fleet_table(replay["contenders"], labels),
        "",
        "Mistakes per 10,000 runs [interval] (count):",
        "",
        mistakes_table(replay["contenders"], labels),
        "",
        "Who finalized each death first when the deployment's kill_stuck_jobs stays on beside ours:",
        "",
        finalizers_table(replay["contenders"], labels),
        "",
        "### Targets (issues 34 and 29), judged on their intervals",
        "",
        targets_table(replay["targets"]),
        "",
    ]
    if witness:
        cmp_ = witness["comparison"]
        recorded = witness.get("recorded_by")
        parts += [
            "### The witness: the real cleanup against the rules model",
            "",
            *([_recorded(recorded), ""] if recorded else []),
            f"Seed {witness['seed']}, contender `{witness['contender']}`, the real cleanup (`run_cleanup` on the embedded "
            f"server) in {witness['wall_seconds']:.0f} s: {cmp_['finalized_by_real_cleanup']} jobs finalized by the real "
            f"cleanup, {cmp_['finalized_by_model']} by the model, {cmp_['same_moment']} by both at the same moment "
            f"(largest difference {cmp_['largest_difference_seconds']:.1f} s); only the model: {cmp_['model_only']}, only "
            f"the real cleanup: {cmp_['real_only']}. Causes it told (and what became of their retries): "
            f"{witness['causes_told']}. Its counts: {witness['counts']}.",
            "",
        ]
    if replay.get("incident"):
        incident_labels = replay["incident_labels"]
        parts += [
            "### A cluster incident (4 pods), apart from the production figures",
            "",
            detection_table(replay["incident"], incident_labels),
            "",
            mistakes_table(replay["incident"], incident_labels),
            "",
        ]
    suggestions = replay["suggestions"]
    contenders = replay["contenders"]
    if "d" in contenders and "c@local-loaded" in contenders:
        c, d = contenders["c@local-loaded"], contenders["d"]
        parts += [
            f"What the suggested T2s change for the cleanup's own finalizations (d against c, the same start latency): "
            f"{d['overdue_finalized']} finalized as past their T2 against {c['overdue_finalized']}; hangs found at "
            f"p50 {_e(d['by_cause']['hang']['p50'])} s against {_e(c['by_cause']['hang']['p50'])} s; healthy runs "
            f"stopped by T2 {_e(d['mistakes_per_10k']['healthy_stopped_by_t2'], 1)} per 10,000 against "
            f"{_e(c['mistakes_per_10k']['healthy_stopped_by_t2'], 1)}; hung worker-hours {d['hung_worker_hours']:.1f} "
            f"against {c['hung_worker_hours']:.1f} (only kill_long_job stops a process).",
            "",
        ]
    parts += [
        f"(d)'s T2s, from `statistics.analysis.analyze` over two days of their own: {suggestions['t2_by_type']}; "
        f"(d) keeps the chart's kill_long_job (2400 s), `d@kill_long` is the labelled what-if at the largest "
        f"suggestion, {suggestions['kill_long_job_what_if_seconds']} s. The deployment's pass: "
        f"{replay['deployment']['finish_seconds']:.3f} s per set_stuck (a model from its counted commands), "
        f"{replay['deployment']['read_seconds_per_started_job'] * 1000:.1f} ms per started job read.",
        "",
    ]
    return "\n".join(parts)
