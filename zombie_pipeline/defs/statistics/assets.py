"""Dagster assets: duration statistics and T2 suggestions, wired around ``zombie_pipeline.statistics``.

Two assets share one daily partitioning (UTC days):

- ``job_duration_tallies``: the jobs finished and the zombies finalized on one
  day, as per-type tallies (float32 durations, counts). A day is read once;
  history is backfilled day by day, before the jobs' 7-day TTL removes it.
- ``job_duration_statistics``: partition D is the window of ``window_days``
  days ending with D. It combines the daily tallies through the IO manager
  (no job is read again), writes the report files, records the suggestions
  in ``zombieT2Suggestions`` and shows them as metadata.

Beside them, ``heartbeat_gap_tallies`` (``defs/statistics/heartbeat_gaps.py``) holds one day of the heartbeat gaps
a watcher saw: the window reads its days too, and suggests the heartbeat timeout from them.

The window asset depends on the last :data:`MAX_WINDOW_DAYS` daily partitions
(a partition mapping is fixed when the code location loads); its config picks
how many of them to use. Days not computed yet are skipped and listed: each
report of a backfill says whether its window is complete, and what a partial
one lacks.

The statistics' computing modules (pandas, pyarrow, pymongoarrow, matplotlib) are imported inside the assets, when a
statistics run executes them: every run loads the whole code location, and a cleanup run must start without them.
"""

import datetime as dt
import pickle
import warnings
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from zombie_pipeline import config
from zombie_pipeline.defs.pushgateway import MetricsGateway
from zombie_pipeline.defs.resources import Databases, ZombiePolicyResource
from zombie_pipeline.defs.tags import PIPELINE_TAG, STATISTICS_GROUP
from zombie_pipeline.observability import metrics
from zombie_pipeline.policy import InvalidPolicy, SuggestionRules, SuggestionSettings, ZombiePolicy
from zombie_pipeline.queue.evidence import GenerationUnknown, decide
from zombie_pipeline.queue.generations import QueueGeneration
from zombie_pipeline.queue.store import Store
from zombie_pipeline.queue.times import utc_now
from zombie_pipeline.simulation.marks import simulation_id
from zombie_pipeline.statistics import DEFAULT_WINDOW_DAYS
from zombie_pipeline.statistics.formatting import day_ranges, window_text
from zombie_pipeline.statistics.gap_tallies import GapPeriod, combine_gaps
from zombie_pipeline.statistics.offenders import DEFAULT_THRESHOLD, find_offenders
from zombie_pipeline.statistics.suggestion_log import save_suggestions
from zombie_pipeline.statistics.tallies import READ_BATCH_SIZE, Period

if TYPE_CHECKING:
    from upath import UPath

GROUP = STATISTICS_GROUP
#: The pickle protocol of Dagster's filesystem IO manager (its PICKLE_PROTOCOL).
PICKLE_PROTOCOL = 4
PARTITIONS_START = config.statistics_start().isoformat()
MAX_WINDOW_DAYS = 28
SUGGESTED_T2_METADATA_PREFIX = "suggested_t2_seconds/"
#: The one T2 for every type that the window supports: the deployment's MAX_JOB_DURATION_SECONDS, plotted per day.
DEPLOYMENT_LIMIT_METADATA = "deployment_max_job_duration_seconds"
#: The heartbeat timeout the window's gaps support (the current one where they support no lower one), plotted per day.
HEARTBEAT_TIMEOUT_METADATA = "suggested_heartbeat_timeout_seconds"
#: The daily heartbeat gaps the window reads (``defs/statistics/heartbeat_gaps.py``, which imports this module).
GAP_TALLIES_KEY = dg.AssetKey("heartbeat_gap_tallies")
#: Offending datasets listed in the statistics report (the repeat_offenders asset lists more).
REPORT_OFFENDERS = 20
#: Windows ending this recently are pushed to the Pushgateway: the daily schedule's (the day that just ended), not
#: a backfill's past days, which would replace the current suggestions with old ones.
CURRENT_WINDOW = dt.timedelta(days=1)
DAILY_PARTITIONS = dg.DailyPartitionsDefinition(start_date=PARTITIONS_START)
with warnings.catch_warnings():  # beta flag: windows that begin before the first partition load what exists
    warnings.simplefilter("ignore", dg.BetaWarning)
    _WINDOW_MAPPING = dg.TimeWindowPartitionMapping(
        start_offset=-(MAX_WINDOW_DAYS - 1), end_offset=0, allow_nonexistent_upstream_partitions=True
    )


class DailyTalliesFiles(dg.UPathIOManager):
    """One pickle per day; a day not computed is None (said at debug level), not an error."""

    extension = ""

    def __init__(self, base_dir: str) -> None:
        from upath import UPath

        super().__init__(base_path=UPath(base_dir))

    def dump_to_path(self, context: dg.OutputContext, obj: Any, path: "UPath") -> None:
        with path.open("wb") as file:
            pickle.dump(obj, file, PICKLE_PROTOCOL)

    def load_from_path(self, context: dg.InputContext, path: "UPath") -> Any:
        try:
            with path.open("rb") as file:
                return pickle.load(file)
        except FileNotFoundError:
            context.log.debug(f"no tallies at {path}: that day was not computed")
            return None


class DailyTalliesConfig(dg.Config):
    batch_size: int = Field(
        default=READ_BATCH_SIZE,
        ge=100,
        le=100_000,
        description="Documents per cursor batch: bounds the memory of a read.",
    )
    create_cache_index: bool = Field(
        default=False,
        description="Where durations are read from the cache (2023-12 on) and it lacks the (kind, updated_at, dataset) "
        "index, create it (the deployment declares it from 2026); unset, the read is refused rather than scan the cache.",
    )


class DurationStatisticsConfig(dg.Config, SuggestionSettings):
    """The suggestion rules (``policy.SuggestionSettings``), the window, and where the report goes."""

    window_days: int = Field(
        default=DEFAULT_WINDOW_DAYS,
        ge=1,
        le=MAX_WINDOW_DAYS,
        description="Days in the window, ending with the partition's day.",
    )
    reports_dir: str | None = Field(
        default=None,
        description="Where the CSV, JSON, Markdown and PNG go; unset: reports/ (or $ZOMBIE_PIPELINE_HOME/reports).",
    )
    save_suggestions: bool = Field(
        default=True, description="Record the suggestions in zombieT2Suggestions, where the cleanup can opt in to them."
    )

    def rules(self) -> SuggestionRules:
        """The rules, checked: a value out of bounds fails the step in one line, never retried."""
        try:
            return SuggestionRules.of(self)
        except InvalidPolicy as error:
            refused = dg.MetadataValue.json(list(error.problems) or [str(error)])
            raise dg.Failure(description=str(error), metadata={"refused": refused}, allow_retries=False) from None


class DailyTalliesStorage(dg.ConfigurableIOManagerFactory["DailyTalliesFiles"]):
    """Where the daily tallies are kept: pickled under the instance's storage directory, as Dagster's filesystem IO
    manager keeps them (``$DAGSTER_HOME/storage/job_duration_tallies/<day>``), so the days computed before stay read.

    A day of a window not computed yet loads as None, which the statistics list as missing. Dagster's own manager
    logs a warning for each (``allow_missing_partitions``): the 28 days the window's mapping spans, some 21 of them
    outside a 7-day window, in every statistics run.
    """

    base_dir: str | None = Field(default=None, description="Unset: the instance's storage directory.")

    def create_io_manager(self, context: dg.InitResourceContext) -> DailyTalliesFiles:
        instance = context.instance
        return DailyTalliesFiles(self.base_dir or (instance.storage_directory() if instance else "."))


with warnings.catch_warnings():  # beta: an asset's own IO manager, so that every job and materialize() uses it
    warnings.simplefilter("ignore", dg.BetaWarning)
    _daily_asset = dg.asset(
        group_name=GROUP,
        partitions_def=DAILY_PARTITIONS,
        kinds={"mongodb", "pandas"},
        io_manager_def=DailyTalliesStorage(),
    )


@_daily_asset
def job_duration_tallies(
    context: dg.AssetExecutionContext,
    config: DailyTalliesConfig,
    databases: Databases,
    zombie_policy: ZombiePolicyResource,
) -> dg.Output[Period]:
    """Per job type, one UTC day: final statuses, durations (float32) and audited zombies.

    Computed once per day from the runs that ended that day (the finished jobs
    where the queue keeps them, else the cache entries, indexed, projected,
    batched) and the zombie events finalized that day; the window statistics
    combine these instead of reading old documents again.
    """
    from zombie_pipeline.statistics.cache_source import CacheIndexMissing
    from zombie_pipeline.statistics.sources import read_history

    window = context.partition_time_window
    zombie_policy.record_source(context)
    with databases.store_for(context, "job_duration_tallies: reading a day of job history") as store:
        generation = _queue_generation(store, zombie_policy.policy())
        try:
            period = read_history(
                store, generation, window.start, window.end, config.batch_size, config.create_cache_index
            )
        except CacheIndexMissing as error:
            raise dg.Failure(
                description=str(error),
                metadata={"to_create_it": "create_cache_index: true in this asset's config"},
                allow_retries=False,
            ) from None
        period.origin = simulation_id(store)  # a window never mixes in a simulation dropped since
        rows = ["| type | jobs | successful | zombies |", "|---|---|---|---|"]
        for job_type, tally in sorted(period.tallies.items()):
            rows.append(
                f"| `{job_type}` | {sum(tally.statuses.values())} | {len(tally.success)} | {sum(tally.zombies.values())} |"
            )
        return dg.Output(
            period,
            metadata={
                "source": period.source,
                "queue_generation": generation.name,
                "documents_read": period.jobs_read,
                "zombie_events_read": period.events_read,
                "successful_jobs": sum(len(tally.success) for tally in period.tallies.values()),
                "skipped_documents": sum(period.bad_data.values()),
                "bad_data": dg.MetadataValue.json(dict(period.bad_data)),
                "types": dg.MetadataValue.md("\n".join(rows)),
                **daily_metadata(period),
            },
        )


def _queue_generation(store: Store, policy: ZombiePolicy) -> QueueGeneration:
    """The queue's generation, which says where durations live; a run fails, with the evidence, where it is undecided."""
    generations = decide(store, policy)
    try:
        return generations.required_queue()
    except GenerationUnknown as error:
        candidates = dg.MetadataValue.json(list(generations.queue_verdict.candidates))
        metadata: dict[str, Any] = {
            "queue_generation_candidates": candidates,
            "to_decide": "set queue_generation in the policy",
        }
        raise dg.Failure(description=str(error), metadata=metadata, allow_retries=False) from None


def metadata_key(prefix: str, job_type: str) -> str:
    """``prefix/type``, the type without its leading slash (``runs/first-rows``): a key the UI plots and links."""
    return f"{prefix}/{job_type.lstrip('/')}"


def daily_metadata(period: Period) -> dict[str, dg.MetadataValue]:
    """Per type, numbers whose plot over the daily partitions means something: runs, p50 and p99 seconds, zombies.

    A day without successful runs of a type has no percentiles: its point is left out, not drawn at zero.
    """
    from zombie_pipeline.statistics.quantiles import success_statistics

    metadata: dict[str, dg.MetadataValue] = {}
    for job_type, tally in sorted(period.tallies.items()):
        metadata[metadata_key("runs", job_type)] = dg.MetadataValue.int(sum(tally.statuses.values()))
        metadata[metadata_key("zombies", job_type)] = dg.MetadataValue.int(sum(tally.zombies.values()))
        statistics = success_statistics(tally.success)
        for name in ("p50", "p99"):
            seconds = statistics[name]
            if seconds is not None:
                metadata[metadata_key(f"{name}_seconds", job_type)] = dg.MetadataValue.float(round(seconds, 3))
    return metadata


def tallies_by_day(tallies: Mapping[str, Period | None] | Period | None) -> dict[str, Period]:
    """The window's daily tallies by day, those computed. The IO manager hands one day over bare, not in a mapping:
    the window of the first daily partition (a backfill's first day) holds only that one; a day not computed is
    None (``DailyTalliesFiles``)."""
    if isinstance(tallies, Period):
        return {f"{tallies.start:%Y-%m-%d}": tallies}
    return {day: period for day, period in (tallies or {}).items() if period is not None}


def window_gaps(
    gap_tallies: Mapping[str, GapPeriod | None] | GapPeriod | None,
    days: list[str],
    start: dt.datetime,
    end: dt.datetime,
) -> GapPeriod:
    """The window's heartbeat gaps, from the daily gap tallies of its days (a day not computed holds none)."""
    by_day = {f"{gap_tallies.start:%Y-%m-%d}": gap_tallies} if isinstance(gap_tallies, GapPeriod) else gap_tallies or {}
    return combine_gaps([gaps for day in days if (gaps := by_day.get(day)) is not None], start, end)


def window_days_of(partition_key: str, window_days: int) -> list[str]:
    """The days of the window ending with ``partition_key``, oldest first (those before the first partition included:
    they are days the window lacks too)."""
    last = dt.date.fromisoformat(partition_key)
    return [(last - dt.timedelta(days=offset)).isoformat() for offset in reversed(range(window_days))]


@dg.asset(
    group_name=GROUP,
    partitions_def=DAILY_PARTITIONS,
    kinds={"pandas"},
    ins={
        "tallies": dg.AssetIn(
            key=job_duration_tallies.key,
            partition_mapping=_WINDOW_MAPPING,
            dagster_type=dg.Any,  # a mapping of days, or one day bare, a day not computed None (see tallies_by_day)
        ),
        "gap_tallies": dg.AssetIn(
            key=GAP_TALLIES_KEY,
            partition_mapping=_WINDOW_MAPPING,
            dagster_type=dg.Any,  # as the tallies: a mapping of days, or one day bare, a day not computed None
        ),
    },
)
def job_duration_statistics(
    context: dg.AssetExecutionContext,
    config: DurationStatisticsConfig,
    databases: Databases,
    zombie_policy: ZombiePolicyResource,
    metrics_gateway: MetricsGateway,
    tallies: Mapping[str, Period | None] | Period | None,
    gap_tallies: Mapping[str, GapPeriod | None] | GapPeriod | None,
) -> dg.MaterializeResult[None]:
    """Duration statistics and suggested T2 per job type over the window ending with this day.

    Counts by final status, successful-duration percentiles, zombies per reason
    and their rate; the suggested T2 with its confidence interval, backtest and
    censoring flag; CSV, JSON, Markdown and a chart in the reports directory; the
    T2 changes as a ready-to-paste ``zombie_policy`` snippet; the one T2 the data
    supports for the deployment's ``MAX_JOB_DURATION_SECONDS``; whether the window
    is complete; the window's repeat offenders as a section of the report. Suggestions are recorded for the cleanup's opt-in
    ``use_suggested_max_durations``. The window ending with the last day is pushed to the Pushgateway.
    """
    from zombie_pipeline.statistics.charts import duration_charts, gap_chart
    from zombie_pipeline.statistics.reports import markdown_table, offenders_markdown, policy_snippet, write_reports
    from zombie_pipeline.statistics.window import WindowTallies, window_report

    rules = config.rules()  # a value out of bounds is refused before anything is read
    source = zombie_policy.record_source(context)
    with databases.store_for(context, "job_duration_statistics: reading the window's suggestions and history") as store:
        policy = zombie_policy.in_force(store)  # "current T2" is the one the cleanup applies
        generation = _queue_generation(store, policy)
        wanted = window_days_of(context.partition_key, config.window_days)
        days = WindowTallies.of(tallies_by_day(tallies), wanted, simulation_id(store))
        to_complete = days.completing(PARTITIONS_START, job_duration_tallies.key.to_user_string())
        window_end = context.partition_time_window.end
        window_start = window_end - dt.timedelta(days=config.window_days)
        gaps = window_gaps(gap_tallies, wanted, window_start, window_end)
        report = window_report(
            store, generation, policy, days.loaded, window_start, window_end, rules, days.missing, gaps
        )
        # the report's section on repeat offenders: the window's datasets finalized at least DEFAULT_THRESHOLD times
        offenders = offenders_markdown(
            find_offenders(store, window_start, window_end, DEFAULT_THRESHOLD, limit=REPORT_OFFENDERS)
        )
        files = write_reports(report, config.reports_dir, sections=[offenders])
        saved = save_suggestions(store.suggestions, report) if config.save_suggestions else False
    if days.dropped:
        context.log.warning(
            f"the tallies of {day_ranges(days.dropped)} were read from other databases than these (a simulation dropped "
            "since: simulate --drop): left out of the window"
        )
    if to_complete:
        context.log.warning(f"a partial window: {to_complete}")
    if config.save_suggestions and not saved:
        context.log.info("the suggestions recorded for this window cover more of its days: kept")
    suggested = {
        SUGGESTED_T2_METADATA_PREFIX + entry.job_type.lstrip("/"): dg.MetadataValue.float(
            float(entry.suggested_t2_seconds)
        )
        for entry in report.types
        if entry.enough_data
    }
    changes = report.t2_changes()
    deployment = report.deployment_limit
    limit = (
        {DEPLOYMENT_LIMIT_METADATA: dg.MetadataValue.float(float(deployment.seconds))}
        if deployment is not None and deployment.seconds is not None
        else {}
    )
    charts = {
        metadata_key("chart", job_type): dg.MetadataValue.md(chart)
        for job_type, chart in duration_charts(report).items()
    }
    heartbeat: dict[str, dg.MetadataValue] = {}
    if report.heartbeat is not None:  # always there from window_report: the type checker does not know it
        heartbeat["heartbeat_gaps_chart"] = dg.MetadataValue.md(gap_chart(report.heartbeat))
        heartbeat[HEARTBEAT_TIMEOUT_METADATA] = dg.MetadataValue.float(float(report.heartbeat.suggested_seconds))
    if window_end >= utc_now() - CURRENT_WINDOW:
        pushed = metrics_gateway.push(context, partial(metrics.statistics_figures, report), databases.queue_database)
    else:
        pushed = {"metrics_push": "not pushed: a past window (only the window ending with the last day is)"}
    return dg.MaterializeResult(
        metadata={
            "window": window_text(report),
            "policy_source": source.describe(),
            "statistics": dg.MetadataValue.md(markdown_table(report)),
            **charts,
            **heartbeat,
            "zombie_policy_snippet": dg.MetadataValue.md("```yaml\n" + policy_snippet(report) + "```"),
            "repeat_offenders": dg.MetadataValue.md(offenders),
            **suggested,
            "source": report.source,
            "types": len(report.types),
            "types_to_change": len(changes),
            "types_lowering_withheld": sum(entry.lowering_withheld for entry in report.types),
            "censored_types": dg.MetadataValue.json([entry.job_type for entry in report.types if entry.censored]),
            **limit,
            "window_complete": report.complete,
            "days_present": report.days_present,
            "days_expected": report.days_expected,
            "missing_days": dg.MetadataValue.json(report.missing_days),
            "days_of_other_databases": dg.MetadataValue.json(days.dropped),
            **({"to_complete_it": to_complete} if to_complete else {}),
            "suggestions_saved": saved,
            "skipped_documents": sum(report.bad_data.values()),
            "bad_data": dg.MetadataValue.json(report.bad_data),
            "csv": dg.MetadataValue.path(str(files.csv)),
            "json": dg.MetadataValue.path(str(files.json)),
            "markdown": dg.MetadataValue.path(str(files.markdown)),
            "chart": dg.MetadataValue.path(str(files.chart)),
            **pushed,
        }
    )


duration_statistics_job = dg.define_asset_job(
    "duration_statistics_job",
    selection=dg.AssetSelection.groups(GROUP),
    description="One day's tallies, then the statistics and T2 suggestions of the window ending that day.",
    # The production run queue (deploy/dagster.yaml) caps the statistics runs in flight on this tag, so a long
    # backfill never holds every slot a cleanup needs.
    tags={PIPELINE_TAG: STATISTICS_GROUP},
)
