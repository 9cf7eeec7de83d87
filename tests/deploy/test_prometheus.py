"""The alert rules and the dashboard an operator loads as they are: valid, tested, and about the metrics we push.

``promtool`` (Debian's ``prometheus`` package, which ``.ci/run`` installs) checks the rules, checks a Prometheus
configuration that loads them as the docs say (``rule_files: [deploy/prometheus/*.yaml]``), and runs their unit tests
(deploy/prometheus/tests/alerts.test.yaml), a firing and a quiet case for every rule. Every query of the rules and of
the dashboard is parsed as PromQL and may name only metrics of ``zombie_pipeline.observability.metrics.METRIC_NAMES`` (and
Prometheus' own ``up``, for the gateway itself). Every runbook link is the alert's section of docs/deploy.md on the
project's repository.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Iterator

import promql_parser
import yaml

from tests.deploy.processes import REPO_ROOT
from tests.pushgateway import binary_or_skip
from zombie_pipeline import config
from zombie_pipeline.observability.metrics import METRIC_NAMES, METRIC_OF_SAMPLE

PROMETHEUS = REPO_ROOT / "deploy" / "prometheus"
RULES_FILE = PROMETHEUS / "alerts.yaml"
RULE_TESTS_FILE = PROMETHEUS / "tests" / "alerts.test.yaml"
DASHBOARD_FILE = REPO_ROOT / "deploy" / "grafana" / "zombie-pipeline.json"
DOCS = (REPO_ROOT / "docs" / "deploy.md").read_text()
RULES = [rule for group in yaml.safe_load(RULES_FILE.read_text())["groups"] for rule in group["rules"]]
DASHBOARD = json.loads(DASHBOARD_FILE.read_text())
#: Where the runbooks are: docs/deploy.md on the project's repository, whose address pyproject.toml holds.
RUNBOOKS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"] + (
    "/blob/main/docs/deploy.md"
)
#: Prometheus' own series a rule may read: the gateway's scrape.
PROMETHEUS_OWN = {"up"}
#: Grafana's own variables in a query, replaced by a value of their kind before it is parsed as PromQL.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [binary_or_skip("promtool", "prometheus"), *args], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


def metric_names(expr: str) -> set[str]:
    """The metric of every vector selector in a PromQL expression (a selector without a name is refused; a
    histogram's buckets, count and sum are the histogram's)."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    names: set = set()
    promql_parser.walk(
        promql_parser.parse(expr),
        lambda node: names.add(node.name) if isinstance(node, promql_parser.VectorSelector) else None,
    )
    assert None not in names, f"a selector without a metric name: {expr}"
    return {METRIC_OF_SAMPLE.get(name, name) for name in names}


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable; ``label_values(m, l)`` gives its metric."""
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in DASHBOARD["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
            assert found, f"variable {variable['name']}: {query}"
            yield f"variable {variable['name']}", found.group(1)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (lower case, punctuation dropped, spaces to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_promtool_accepts_the_alert_rules():
    checked = promtool("check", "rules", str(RULES_FILE))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in checked.stdout


def test_prometheus_loads_the_rules_folder_as_the_docs_say_and_finds_the_rules_alone(tmp_path):
    """``rule_files: [deploy/prometheus/*.yaml]`` matches the rules, never their unit tests (a folder of their own)."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(PROMETHEUS / "*.yaml")],
                "scrape_configs": [
                    {"job_name": "pushgateway", "honor_labels": True, "static_configs": [{"targets": ["gw:9091"]}]}
                ],
            }
        )
    )
    checked = promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in checked.stdout
    assert sorted(path.name for path in PROMETHEUS.glob("*.yaml")) == [RULES_FILE.name]


def test_the_rule_tests_pass_with_a_firing_and_a_quiet_case_for_every_alert():
    cases = [case for test in yaml.safe_load(RULE_TESTS_FILE.read_text())["tests"] for case in test["alert_rule_test"]]
    for rule in RULES:
        mine = [case for case in cases if case["alertname"] == rule["alert"]]
        assert any(case["exp_alerts"] for case in mine), f"{rule['alert']} is never shown firing"
        assert any(not case["exp_alerts"] for case in mine), f"{rule['alert']} is never shown quiet"
    tested = promtool("test", "rules", str(RULE_TESTS_FILE))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_severity_a_summary_and_a_runbook_in_the_docs_on_the_repository():
    anchors = {github_anchor(line.lstrip("#")) for line in DOCS.splitlines() if line.startswith("#")}
    assert len({rule["alert"] for rule in RULES}) == len(RULES)
    assert RUNBOOKS.startswith("https://")
    for rule in RULES:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == RUNBOOKS and anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]


def test_every_alert_names_only_metrics_the_pipeline_pushes():
    for rule in RULES:
        names = metric_names(rule["expr"])
        assert names and names <= METRIC_NAMES | PROMETHEUS_OWN, f"{rule['alert']}: {sorted(names - METRIC_NAMES)}"


def test_the_dashboard_parses_and_every_query_names_a_metric_the_pipeline_pushes():
    assert DASHBOARD["schemaVersion"] >= 39 and DASHBOARD["uid"] and DASHBOARD["title"]
    shown: set[str] = set()
    queries = list(dashboard_queries())
    assert len(queries) > 20
    for where, query in queries:
        names = metric_names(query)
        assert names and names <= METRIC_NAMES, f"{where}: {sorted(names - METRIC_NAMES)}"
        shown |= names
    assert shown == METRIC_NAMES  # a dashboard of the same figures: every one has a panel


def test_the_dashboards_panels_have_their_own_ids_places_and_the_chosen_data_source():
    panels = DASHBOARD["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    for panel in panels:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, (
            panel["title"]
        )
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert 'queue_database=~"$queue_database"' in target["expr"], panel["title"]
    [source] = [variable for variable in DASHBOARD["templating"]["list"] if variable["type"] == "datasource"]
    assert source["name"] == "datasource" and source["query"] == "prometheus"


def test_the_helm_values_and_the_docs_name_the_gateway_variable():
    assert config.PUSHGATEWAY_URL_ENV in (REPO_ROOT / "deploy" / "helm" / "values.yaml").read_text()
    assert f"`{config.PUSHGATEWAY_URL_ENV}`" in DOCS
    assert f"`{config.PUSHGATEWAY_URL_ENV}`" in (REPO_ROOT / "docs" / "configuration.md").read_text()


def test_the_docs_list_every_metric():
    watching = DOCS[DOCS.index("Watching it") :]
    for name in METRIC_NAMES:
        assert f"`{name}`" in watching, name
