"""`runlease dev --prometheus`: a real Prometheus beside the dev stack, with
the shipped alert rules, scraping the API and the workers; stopped with it."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator

import httpx
import pytest

from runlease.monitoring import alert_rules
from tests.integration.test_dev_and_cli import TENANT_TOKEN, Dev, alive, descendants, postgres_pids
from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow


@pytest.fixture
def dev() -> Iterator[Dev]:
    d = Dev(2, "--prometheus")
    d.start()
    try:
        yield d
    finally:
        if d.proc is not None and d.proc.poll() is None:
            for pid in descendants(d.proc.pid):
                os.kill(pid, signal.SIGKILL)
            d.proc.kill()
            d.proc.wait(10)
        for pid in postgres_pids(d.dir):
            os.kill(pid, signal.SIGKILL)


def prometheus_url(dev: Dev) -> str:
    found = until_sync(lambda: re.search(r"^prometheus (http://\S+)", dev.log.read_text(),
                                         re.MULTILINE), what="the banner's prometheus line")
    return found.group(1)


def query(url: str, expr: str) -> list[dict[str, object]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, object]] = answer["data"]["result"]
    return result


def test_dev_prometheus_scrapes_the_stack_with_the_shipped_rules(dev: Dev) -> None:
    url = prometheus_url(dev)
    rules = httpx.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    shipped = re.findall(r"- alert: (\w+)", alert_rules())
    assert sorted(r["name"] for g in rules for r in g["rules"]) == sorted(shipped)
    assert len(shipped) == 6

    def targets_up() -> bool:
        active = httpx.get(f"{url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        jobs = sorted(t["labels"]["job"] for t in active if t["health"] == "up")
        return jobs == ["runlease-api", "runlease-worker", "runlease-worker"]
    until_sync(targets_up, timeout_s=30, what="the API and both workers scraped")

    # A run that dies: the queue's gauges (the operator's, in a cluster) come
    # from the dev API, so the dead-letter series is there.
    answer = httpx.post(f"{dev.url}/v1/runs", timeout=10,
                        headers={"Authorization": f"Bearer {TENANT_TOKEN}"},
                        json={"input": {"steps": [{"fail": "fatal"}]}})
    assert answer.status_code == 201, answer.text
    until_sync(lambda: query(url, 'runlease_dead_runs{pool="default", error_code="fatal"} == 1'),
               timeout_s=30, what="the dead run in Prometheus")
    assert query(url, 'runlease_queue_runs{pool="default"}') is not None
    until_sync(lambda: query(url, 'runlease_runs_finished_total{outcome="dead"}'),
               timeout_s=30, what="the worker's finished runs in Prometheus")

    assert dev.proc is not None
    children = descendants(dev.proc.pid)
    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(60) == 0, dev.log.read_text()[-3000:]
    until_sync(lambda: not any(alive(p) for p in children), timeout_s=15,
               what="every process of runlease dev, prometheus too, to exit")
