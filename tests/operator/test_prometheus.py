"""A real Prometheus (Debian's server, runlease/monitoring) scraping a real
`runlease api` process, real `runlease worker` processes and the operator,
with the shipped alert rules (runlease/monitoring/alerts.yaml, the chart's
PrometheusRule): a kill -9 of a worker holding runs makes the lease-expiry
alert pending or firing, a run that exhausts its attempts the dead-letter
alert, and every panel query of the shipped Grafana dashboard returns a
series.

The operator runs in this process against KMock (tests/operator/conftest.py:
it needs a Kubernetes API); its job keeps only the operator's own metrics,
so nothing this test process exported otherwise is mistaken for a worker's.

The shipped rules wait 5-10 minutes (`for:`) over 10-15 minute windows: the
rules loaded here are derived mechanically from the shipped file (every
range and offset becomes WINDOW, every `for:` becomes FOR), the expressions
otherwise the shipped ones (a test below checks that only those changed).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from runlease.db.embedded import free_port
from runlease.monitoring import PrometheusServer, alert_rules, prometheus_binary
from tests.operator.conftest import create_pool, database_secret, running_operator
from tests.support.api import ADMIN_TOKEN, TOKENS
from tests.support.api_process import ApiProcess
from tests.support.proc import WorkerProcess
from tests.support.waiting import until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "runlease" / "dashboards" / "runlease.json"
WINDOW, FOR = "20s", "1s"
# Grafana's $__rate_interval is at least four scrape intervals (1 s here).
RATE_INTERVAL = "10s"
SCRIPT = "runlease.agents.script:agent"
FAST = {"lease_s": 4, "heartbeat_interval_s": 1, "poll_interval_s": 0.5,
        "reaper_interval_s": 0.5, "leader_ttl_s": 2, "agent": SCRIPT}
# What the operator's job keeps: the metrics only the operator exports.
OPERATOR_METRICS = (r"runlease_(queue_runs|dead_runs|oldest_pending_seconds|"
                    r"lease_expiries_recent|pool_.*|operator_.*)")
_DURATION = re.compile(r"\[(\d+[smhd])\]|offset (\d+[smhd])")


def shortened_rules(text: str) -> str:
    """The shipped rules with every range, offset and `for:` shortened."""
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _DURATION.sub(
                lambda m: f"[{WINDOW}]" if m.group(1) else f"offset {WINDOW}", rule["expr"])
            rule["for"] = FOR
    out: str = yaml.safe_dump(doc, sort_keys=False)
    return out


def test_the_shortened_rules_change_only_windows_and_for() -> None:
    shipped = yaml.safe_load(alert_rules())["groups"][0]["rules"]
    short = yaml.safe_load(shortened_rules(alert_rules()))["groups"][0]["rules"]
    assert len(short) == len(shipped) == 6
    for old, new in zip(shipped, short, strict=True):
        assert _DURATION.sub("W", old["expr"]) == _DURATION.sub("W", new["expr"])
        assert {k: v for k, v in old.items() if k not in ("expr", "for")} == \
            {k: v for k, v in new.items() if k not in ("expr", "for")}
    assert sum("[20s]" in r["expr"] or "offset 20s" in r["expr"] for r in short) == 4


@dataclass
class Stack:
    db_url: str
    api: ApiProcess
    prometheus: PrometheusServer
    tmp: Path
    worker_ports: dict[str, int]
    workers: dict[str, WorkerProcess] = field(default_factory=dict)

    def worker(self, name: str, **settings: Any) -> WorkerProcess:
        process = WorkerProcess(self.db_url, self.tmp, name,
                                FAST | {"metrics_port": self.worker_ports[name]} | settings)
        self.workers[name] = process
        return process.start()

    def submit(self, body: dict[str, Any], n: int = 1, tenant: str = "acme") -> list[str]:
        ids = []
        for _ in range(n):
            answer = httpx.post(f"{self.api.url}/v1/runs", json=body, timeout=10,
                                headers={"Authorization": f"Bearer {TOKENS[tenant]}"})
            assert answer.status_code == 201, answer.text
            ids.append(answer.json()["id"])
        return ids

    def count(self, sql: str) -> int:
        with psycopg.connect(self.db_url) as conn:
            row = conn.execute(sql).fetchone()
        assert row is not None
        return int(row[0])

    async def series(self, expr: str, what: str, timeout_s: float = 30) -> list[Any]:
        async def probe() -> list[Any]:
            return self.prometheus.query(expr)
        found: list[Any] = await until(probe, timeout_s=timeout_s, what=what)
        return found

    async def alert(self, name: str, timeout_s: float = 45) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            return next((a for a in self.prometheus.alerts()
                         if a["labels"]["alertname"] == name
                         and a["state"] in ("pending", "firing")), None)
        found: dict[str, Any] = await until(probe, timeout_s=timeout_s, every_s=0.5,
                                            what=f"{name} pending or firing")
        return found


@asynccontextmanager
async def monitored(db_url: str, tmp_path: Path, kmock: Any, *, names: tuple[str, ...],
                    operator: bool) -> AsyncIterator[Stack]:
    """The API, room for workers `names`, the operator (in this process, on
    KMock) if asked, and a Prometheus scraping them all every second."""
    api = ApiProcess(db_url, tmp_path)
    ports = {name: free_port() for name in names}
    operator_port = free_port()
    jobs = {"api": [f"127.0.0.1:{api.port}"],
            "worker": [f"127.0.0.1:{p}" for p in ports.values()]}
    if operator:
        jobs["operator"] = [f"127.0.0.1:{operator_port}"]
    prometheus = PrometheusServer(tmp_path / "prometheus", free_port(), jobs,
                                  rules=shortened_rules(alert_rules()), interval_s=1,
                                  keep={"operator": OPERATOR_METRICS},
                                  binary=prometheus_binary(ROOT / "tools" / "bin"))
    stack = Stack(db_url, api, prometheus, tmp_path, ports)
    try:
        api.start()
        prometheus.start()
        if not operator:
            yield stack
            return
        database_secret(kmock, db_url)
        async with running_operator(kmock, db_url, metrics_port=operator_port,
                                    metrics_host="127.0.0.1", reaper=False):
            await create_pool(kmock, "default", concurrencyPerWorker=2,
                              replicas={"min": 0, "max": 5})
            yield stack
    finally:
        for process in stack.workers.values():
            process.cleanup()
        api.cleanup()
        prometheus.stop()


async def kill_holder(stack: Stack, name: str, held: int) -> None:
    """kill -9 of worker `name` once it holds `held` runs."""
    async def holding() -> bool:
        return stack.count("SELECT count(*) FROM agent_runs WHERE status = 'leased'"
                           f" AND locked_by LIKE 'pod-{name}:%%'") == held
    await until(holding, timeout_s=30, what=f"worker {name} to hold {held} runs")
    stack.workers[name].kill9()


async def test_a_kill_9_of_a_worker_holding_runs_fires_the_lease_expiry_alert(
    db_url: str, tmp_path: Path,
) -> None:
    async with monitored(db_url, tmp_path, None, names=("reaper", "a"),
                         operator=False) as stack:
        answer = await asyncio.to_thread(
            httpx.put, f"{stack.api.url}/v1/pools/elsewhere", json={}, timeout=10,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        assert answer.status_code in (200, 201), answer.text
        # The reaper's leader serves another pool: it claims none of these runs.
        stack.worker("reaper", pool="elsewhere", reaper=True)
        stack.worker("a", concurrency=2, reaper=False)
        # The leader's counters exist at 0 before any reap (services/reaper.py:
        # a series born at its first value would be no increase to rate()).
        await stack.series('runlease_reaped_total{pool="default", to="pending"} == 0',
                           "the reaper's counters scraped before any reap")
        stack.submit({"input": {"steps": [{"sleep": 120}]}}, n=2)
        await kill_holder(stack, "a", 2)
        alert = await stack.alert("RunleaseLeaseExpiriesHigh")
        assert alert["labels"]["pool"] == "default"
        assert float(alert["value"]) > 1


async def test_a_run_that_exhausts_its_attempts_fires_the_dead_letter_alert(
    db_url: str, tmp_path: Path, kmock: Any, kubeconfig: str,
) -> None:
    async with monitored(db_url, tmp_path, kmock, names=("w",), operator=True) as stack:
        stack.worker("w", concurrency=2, reaper=True)
        # The gauge is there (0 dead runs) before: the alert is a rise, not a series.
        await stack.series('runlease_pool_replicas{pool="default"}', "the operator scraped")
        assert not [a for a in stack.prometheus.alerts()
                    if a["labels"]["alertname"] == "RunleaseDeadLettersRising"]
        stack.submit({"input": {"steps": [{"fail": "retryable"}]}, "max_attempts": 2,
                      "backoff_base_s": 1})
        await stack.series('runlease_dead_runs{pool="default"} == 1', "the dead run exported")
        alert = await stack.alert("RunleaseDeadLettersRising")
        assert alert["labels"]["pool"] == "default"
        assert "exhausted their attempts" in alert["annotations"]["description"]


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expression) of every target of every panel, the
    template variables substituted as Grafana does for `All`."""
    variables = {v["name"]: v.get("allValue", ".*") for v in board["templating"]["list"]
                 if v["type"] == "query"}
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            for name, value in variables.items():
                expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
            assert "$" not in expr, expr
            out.append((panel["title"], expr))
    return out


async def test_every_panel_of_the_dashboard_shows_a_series(
    db_url: str, tmp_path: Path, kmock: Any, kubeconfig: str,
) -> None:
    board = json.loads(DASHBOARD.read_text())
    queries = panel_queries(board)
    assert len(queries) >= 12
    async with monitored(db_url, tmp_path, kmock, names=("a", "b"), operator=True) as stack:
        # The operator made the pool's Deployment (no runs: no replicas) first,
        # so that the backlog below is a scale change.
        await stack.series('runlease_pool_desired_replicas{pool="default"} == 0',
                           "the operator's first pass scraped")
        # Done runs and a dead letter on b, then runs held (in flight) by both
        # and a backlog that makes the autoscaler scale; then a kill -9 of a:
        # expired leases reaped.
        stack.worker("b", concurrency=4, reaper=True)
        stack.submit({"input": {"steps": [{"emit": {"text": "hi"}}]}}, n=3)
        stack.submit({"input": {"steps": [{"fail": "fatal"}]}})

        async def ended() -> bool:
            return stack.count("SELECT count(*) FROM agent_runs"
                               " WHERE status IN ('done', 'dead')") == 4
        await until(ended, what="the quick runs ended on b")
        stack.worker("a", concurrency=2, reaper=False)
        # Two tenants: the pool's per-tenant cap is not what stops a claiming.
        for tenant in ("acme", "globex"):
            stack.submit({"input": {"steps": [{"sleep": 120}]}}, n=5, tenant=tenant)
        await kill_holder(stack, "a", 2)
        await stack.series("runlease_reaped_total > 0", "the expired leases reaped and scraped")
        async def all_shown() -> bool:
            return all(stack.prometheus.query(expr) for _, expr in queries)
        try:
            await until(all_shown, timeout_s=30, every_s=0.5, what="every panel's series")
        except AssertionError:
            missing = [(t, e) for t, e in queries if not stack.prometheus.query(e)]
            raw = {n: stack.prometheus.query(n) for n in (
                "runlease_dead_runs", "runlease_run_duration_seconds_count",
                "runlease_operator_scale_changes_total", "runlease_pool_desired_replicas")}
            with psycopg.connect(db_url) as conn:
                runs = conn.execute("SELECT status, error_code, count(*) FROM agent_runs"
                                    " GROUP BY 1, 2").fetchall()
            pytest.fail(f"no series: {missing}\nraw: {raw}\nruns: {runs}")
