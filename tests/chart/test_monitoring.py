"""The chart's alerts and dashboard: promtool checks and unit-tests the
rules, and every metric a rule or a panel names must be one runlease
exports (src/runlease/metrics.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Metric
from prometheus_client.metrics import MetricWrapperBase

from runlease import metrics
from runlease.monitoring import alert_rules
from tests.chart.conftest import VALUES_DIR, one

pytestmark = pytest.mark.chart

Render = Callable[..., list[dict[str, Any]]]
TESTS = Path(__file__).parent / "alerts.test.yaml"
ALERTS = {"RunleaseDeadLettersRising", "RunleaseLeaseExpiriesHigh",
          "RunleaseOldestPendingTooOld", "RunleaseNoWorkerHeartbeats",
          "RunleaseReconcileErrors", "RunleaseReaperNoLeader"}
METRIC_NAME = re.compile(r"\brunlease_[a-z0-9_]+")
# The sample names each metric type exposes, as prometheus_client writes them.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",),
            "enum": ("",)}


def exported_names() -> set[str]:
    names = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            described: list[Metric] = value.describe()
            for family in described:
                names |= {family.name + s for s in SUFFIXES[family.type]}
    return names


def test_the_exported_names_are_what_prometheus_sees() -> None:
    names = exported_names()
    assert {"runlease_runs_claimed_total", "runlease_queue_runs",
            "runlease_claim_latency_seconds_bucket", "runlease_leader"} <= names
    assert "runlease_runs_claimed" not in names


def prometheus_rule(rendered: Render, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    return one(rendered(sets=["prometheusRule.enabled=true", *sets]), "PrometheusRule")


def write_rules(rule: dict[str, Any], directory: Path) -> Path:
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, sort_keys=False))
    return path


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_rule_has_the_six_alerts(rendered: Render) -> None:
    rules = [r for g in prometheus_rule(rendered)["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert rule["annotations"]["description"]
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"])


def test_the_packaged_rules_are_the_charts_at_its_defaults(rendered: Render) -> None:
    """runlease/monitoring/alerts.yaml (what `runlease dev --prometheus` and
    the Prometheus tests load) is the chart's PrometheusRule, rendered."""
    packaged = yaml.safe_load(alert_rules())
    assert packaged == {"groups": prometheus_rule(rendered)["spec"]["groups"]}


def test_promtool_check_rules(rendered: Render, promtool: Path, tmp_path: Path) -> None:
    for sets in ((), ("prometheusRule.alertLabels.team=platform",)):
        path = write_rules(prometheus_rule(rendered, sets), tmp_path)
        result = run(promtool, "check", "rules", path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "SUCCESS: 6 rules found" in result.stdout


def test_promtool_check_rules_of_the_monitoring_values(rendered: Render, promtool: Path,
                                                       tmp_path: Path) -> None:
    docs = rendered([VALUES_DIR / "monitoring-ingress-sample.yaml"])
    rule = one(docs, "PrometheusRule")
    assert all(r["labels"]["team"] == "platform"
               for g in rule["spec"]["groups"] for r in g["rules"])
    result = run(promtool, "check", "rules", write_rules(rule, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_alerts(rendered: Render, promtool: Path,
                                           tmp_path: Path) -> None:
    write_rules(prometheus_rule(rendered), tmp_path)
    shutil.copy(TESTS, tmp_path / TESTS.name)
    result = run(promtool, "test", "rules", tmp_path / TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_each_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    suite = yaml.safe_load(TESTS.read_text())
    fires: set[str] = set()
    quiet: set[str] = set()
    for case in suite["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fires == ALERTS, f"no firing case for {ALERTS - fires}"
    assert quiet == ALERTS, f"no quiet case for {ALERTS - quiet}"


def test_an_alert_can_be_turned_off_and_tuned(rendered: Render) -> None:
    rule = prometheus_rule(rendered, ("prometheusRule.alerts.reaperNoLeader.enabled=false",
                                      "prometheusRule.alerts.oldestPending.seconds=1800"))
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == ALERTS - {"RunleaseReaperNoLeader"}
    assert rules["RunleaseOldestPendingTooOld"]["expr"].endswith("> 1800")


def test_alert_expressions_name_only_exported_metrics(rendered: Render) -> None:
    exported = exported_names()
    for group in prometheus_rule(rendered)["spec"]["groups"]:
        for rule in group["rules"]:
            used = set(METRIC_NAME.findall(rule["expr"]))
            assert used, rule["alert"]
            unknown = used - exported
            assert not unknown, f"{rule['alert']} uses {unknown}, not in runlease.metrics"


def dashboard(rendered: Render) -> dict[str, Any]:
    config_map = one(rendered(), "ConfigMap", "-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    parsed: dict[str, Any] = json.loads(config_map["data"]["runlease.json"])
    return parsed


def expressions(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if "definition" in v]
    return exprs


def test_the_dashboard_has_the_panels(rendered: Render) -> None:
    board = dashboard(rendered)
    titles = {p["title"] for p in board["panels"] if p["type"] != "row"}
    assert {"Queue depth by status and tenant", "Claim latency", "Run duration by outcome",
            "Lease expiries", "Dead letters", "In-flight runs per tenant",
            "Worker replicas"} <= titles
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]


def test_dashboard_expressions_name_only_exported_metrics(rendered: Render) -> None:
    exported = exported_names()
    exprs = expressions(dashboard(rendered))
    used = {name for e in exprs for name in METRIC_NAME.findall(e)}
    assert len(used) >= 10
    unknown = used - exported
    assert not unknown, f"the dashboard uses {unknown}, not in runlease.metrics"
    # Histograms are read through their buckets.
    assert "runlease_claim_latency_seconds_bucket" in used
    assert "runlease_run_duration_seconds_bucket" in used
