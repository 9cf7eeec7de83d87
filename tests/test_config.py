"""The environment, read in one place: blank means unset, and where the project keeps its state and reports."""

from __future__ import annotations

import datetime as dt

import pytest

from zombie_pipeline import config


def test_a_blank_variable_is_unset():
    assert config.setting("ANY", {"ANY": "  "}) is None
    assert config.setting("ANY", {"ANY": " value "}) == "value"
    assert config.setting("ANY", {}) is None


def test_database_names_default_to_the_deployments_own(monkeypatch):
    monkeypatch.delenv(config.QUEUE_DATABASE_ENV, raising=False)
    monkeypatch.setenv(config.CACHE_DATABASE_ENV, "cache_prod")
    assert (config.queue_database(), config.cache_database()) == ("datasets_server_queue", "cache_prod")


def test_urls_are_read_when_asked_for_never_kept(monkeypatch):
    monkeypatch.setenv(config.QUEUE_URL_ENV, "mongodb://a:b@queue.example/")
    monkeypatch.delenv(config.CACHE_URL_ENV, raising=False)
    assert config.configured_urls() == ["mongodb://a:b@queue.example/", None]
    monkeypatch.setenv(config.QUEUE_URL_ENV, "mongodb://other.example/")
    assert config.queue_url() == "mongodb://other.example/"


def test_reports_go_under_zombie_pipeline_home_when_it_is_set(tmp_path, monkeypatch):
    monkeypatch.setenv(config.HOME_ENV, str(tmp_path))
    assert config.home() == tmp_path
    assert config.reports_dir() == tmp_path / "reports"
    monkeypatch.delenv(config.HOME_ENV)
    assert config.reports_dir().name == "reports" and config.reports_dir() != tmp_path / "reports"


def test_a_statistics_start_that_is_not_a_date_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv(config.STATISTICS_START_ENV, "last spring")
    with pytest.raises(ValueError, match=config.STATISTICS_START_ENV):
        config.statistics_start()


def test_without_the_variable_the_statistics_start_follows_today(monkeypatch):
    monkeypatch.delenv(config.STATISTICS_START_ENV, raising=False)
    assert config.statistics_start(dt.date(2026, 12, 1)) == dt.date(2026, 10, 6)


def test_a_statistics_start_that_is_set_is_taken(monkeypatch):
    monkeypatch.setenv(config.STATISTICS_START_ENV, "2025-03-01")
    assert config.statistics_start(dt.date(2026, 12, 1)) == dt.date(2025, 3, 1)


@pytest.mark.parametrize(
    "value", ["pushgateway.monitoring:9091", "http://127.0.0.1:9091", "https://push.example/prefix"]
)
def test_a_pushgateway_url_is_taken_as_set(value):
    assert config.pushgateway_url({config.PUSHGATEWAY_URL_ENV: f" {value} "}) == value


def test_without_a_pushgateway_url_metrics_are_off():
    assert config.pushgateway_url({}) is None
    assert config.pushgateway_url({config.PUSHGATEWAY_URL_ENV: " "}) is None


@pytest.mark.parametrize("value", ["ftp://push.example", "push.example:port", "http://"])
def test_a_pushgateway_url_that_is_not_one_is_refused_naming_the_variable(value):
    with pytest.raises(config.SettingError, match=f"^{config.PUSHGATEWAY_URL_ENV}=.* is not a Pushgateway URL"):
        config.pushgateway_url({config.PUSHGATEWAY_URL_ENV: value})


def test_a_pushgateway_url_with_credentials_is_refused_without_showing_them():
    with pytest.raises(config.SettingError) as refused:
        config.pushgateway_url({config.PUSHGATEWAY_URL_ENV: "http://admin:s3cret@push.example:9091"})
    assert config.PUSHGATEWAY_URL_ENV in str(refused.value) and "s3cret" not in str(refused.value)
