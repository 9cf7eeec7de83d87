"""Every environment variable the pipeline reads, read here and nowhere else.

The names of the database variables are the deployment's own, so a
datasets-server environment works unchanged. Values are read when asked for,
never cached: a URL may carry a password, so it is never stored in Dagster
config either.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from zombie_pipeline.queue.cache import DEFAULT_CACHE_DATABASE
from zombie_pipeline.queue.jobs import DEFAULT_QUEUE_DATABASE

QUEUE_URL_ENV = "QUEUE_MONGO_URL"
CACHE_URL_ENV = "CACHE_MONGO_URL"
QUEUE_DATABASE_ENV = "QUEUE_MONGO_DATABASE"
CACHE_DATABASE_ENV = "CACHE_MONGO_DATABASE"
#: Where the embedded server keeps its data, log and state, and where reports go.
HOME_ENV = "ZOMBIE_PIPELINE_HOME"
KILL_CRON_ENV = "ZOMBIE_KILL_CRON"
WEBHOOK_URL_ENV = "ZOMBIE_FAILURE_WEBHOOK_URL"
#: The Prometheus Pushgateway runs push their figures to (``host:port`` or ``http(s)://host:port``); unset: no push.
PUSHGATEWAY_URL_ENV = "ZOMBIE_PUSHGATEWAY_URL"
DAGSTER_HOME_ENV = "DAGSTER_HOME"
#: The first day of the statistics' daily partitions (YYYY-MM-DD); unset: eight weeks back.
STATISTICS_START_ENV = "ZOMBIE_STATISTICS_START"
STATISTICS_DAYS_BACK = 56
#: How long any wait on a MongoDB server may last before the run fails, in milliseconds: connecting, choosing a
#: server, each reply, each operation with its retry (``queue.connections.client_for``; the resources' default, the CLI's).
MONGO_TIMEOUT_ENV = "ZOMBIE_MONGO_TIMEOUT_MS"
#: Minutes without a successful cleanup after which the queue is reported overdue (cleanup_overdue_sensor).
CLEANUP_OVERDUE_MINUTES_ENV = "ZOMBIE_CLEANUP_OVERDUE_MINUTES"
#: The cleanup policy of every run of the location (schedules, sensors, checks; the Launchpad's default): a YAML file.
POLICY_FILE_ENV = "ZOMBIE_POLICY_FILE"
DEFAULT_CLEANUP_OVERDUE_MINUTES = 30

#: The project directory of a source checkout (editable install), else None.
_CHECKOUT = Path(__file__).resolve().parent.parent
SOURCE_CHECKOUT: Path | None = _CHECKOUT if (_CHECKOUT / "pyproject.toml").exists() else None


class SettingError(ValueError):
    """An environment variable holds a value the pipeline cannot use; the message names it."""


def setting(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of an environment variable; None when unset or blank."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    return value or None


def policy_file() -> Path | None:
    """The policy file of the location, when one is set."""
    configured = setting(POLICY_FILE_ENV)
    return Path(configured) if configured else None


def queue_url() -> str | None:
    """The queue's MongoDB URL; None means the embedded default."""
    return setting(QUEUE_URL_ENV)


def cache_url() -> str | None:
    return setting(CACHE_URL_ENV)


def configured_urls() -> list[str | None]:
    """Every database URL of the environment, for masking their credentials."""
    return [queue_url(), cache_url()]


def queue_database() -> str:
    return setting(QUEUE_DATABASE_ENV) or DEFAULT_QUEUE_DATABASE


def cache_database() -> str:
    return setting(CACHE_DATABASE_ENV) or DEFAULT_CACHE_DATABASE


def home() -> Path:
    """Project-local state: ``$ZOMBIE_PIPELINE_HOME``, else ``.zombie_pipeline`` in the checkout (or the cwd)."""
    configured = setting(HOME_ENV)
    if configured:
        return Path(configured).resolve()
    return (SOURCE_CHECKOUT or Path.cwd()) / ".zombie_pipeline"


def reports_dir() -> Path:
    """``$ZOMBIE_PIPELINE_HOME/reports`` when set, else ``reports/`` beside the project (or the cwd)."""
    if setting(HOME_ENV):
        return home() / "reports"
    return home().parent / "reports"


def kill_cron(environ: Mapping[str, str] | None = None) -> str | None:
    """The cleanup schedule's cron when one is set (validated by the schedule)."""
    return setting(KILL_CRON_ENV, environ)


def statistics_start(today: dt.date | None = None) -> dt.date:
    """The first daily partition: far enough back for a few windows, not a history of empty days."""
    configured = setting(STATISTICS_START_ENV)
    if configured:
        try:
            return dt.date.fromisoformat(configured)
        except ValueError:
            raise SettingError(f"{STATISTICS_START_ENV}={configured!r} is not a date (YYYY-MM-DD)") from None
    return (today or dt.date.today()) - dt.timedelta(days=STATISTICS_DAYS_BACK)


def pushgateway_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The Pushgateway's URL when one is set; refused when it is not one, or carries credentials.

    The URL is shown as the metrics resource's config, and the push client sends no credentials from a URL anyway.
    """
    configured = setting(PUSHGATEWAY_URL_ENV, environ)
    if configured is None:
        return None
    parsed = urlsplit(configured if "://" in configured else f"http://{configured}")
    try:
        _ = parsed.port  # a port that is not a number raises
        valid = parsed.scheme in ("http", "https") and bool(parsed.hostname)
    except ValueError:
        valid = False
    if not valid:
        raise SettingError(
            f"{PUSHGATEWAY_URL_ENV}={configured!r} is not a Pushgateway URL: use host:port or http(s)://host:port"
        )
    if parsed.username is not None or parsed.password is not None:
        raise SettingError(
            f"{PUSHGATEWAY_URL_ENV} carries credentials: the push client does not send them and the URL shows in "
            "the UI; give the gateway's URL without them"
        )
    return configured


def mongo_timeout_ms(default: int) -> int:
    """``$ZOMBIE_MONGO_TIMEOUT_MS`` when set (a positive integer), else ``default``."""
    configured = setting(MONGO_TIMEOUT_ENV)
    if configured is None:
        return default
    try:
        value = int(configured)
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingError(f"{MONGO_TIMEOUT_ENV}={configured!r} is not a positive number of milliseconds")
    return value


def dagster_home() -> Path:
    """Where the demo keeps its Dagster runs: ``$DAGSTER_HOME``, else ``dagster/`` in the project home, which
    ``dagster dev`` reads when given it as its ``DAGSTER_HOME`` (unset, it keeps its runs in a temporary directory)."""
    configured = setting(DAGSTER_HOME_ENV)
    return Path(configured).resolve() if configured else home() / "dagster"


def cleanup_overdue_minutes(environ: Mapping[str, str] | None = None) -> int:
    """``$ZOMBIE_CLEANUP_OVERDUE_MINUTES`` when set (a positive integer), else 30."""
    configured = setting(CLEANUP_OVERDUE_MINUTES_ENV, environ)
    if configured is None:
        return DEFAULT_CLEANUP_OVERDUE_MINUTES
    if not configured.isdigit() or int(configured) <= 0:
        raise SettingError(f"{CLEANUP_OVERDUE_MINUTES_ENV}={configured!r} is not a positive number of minutes")
    return int(configured)
