"""A Prometheus server beside a runlease stack, with the shipped alert rules.

`alerts.yaml` (package data) is the chart's PrometheusRule rendered at its
defaults, as a plain rule file (tests/chart keeps the two equal).
`PrometheusServer` runs Debian's `prometheus` binary (the package that
scripts/install-tools installs for promtool) on 127.0.0.1, in a folder of
its own, scraping the targets it is given: `runlease dev --prometheus`
starts one for a person to look at, and the Prometheus tests start one the
same way (tests/operator/test_prometheus.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from runlease.errors import RunleaseError

# Debian's prometheus package puts the server here (promtool beside it).
PROMETHEUS_BIN = "/usr/bin/prometheus"


def alert_rules() -> str:
    """The shipped alert rules (a Prometheus rule file's text)."""
    return resources.files("runlease.monitoring").joinpath("alerts.yaml").read_text(
        encoding="utf-8")


def prometheus_binary(*also: Path) -> str:
    """The prometheus server binary: Debian's, else one of `also` (a
    checkout's tools/bin, where scripts/install-tools may extract it), else
    one on PATH."""
    for candidate in (Path(PROMETHEUS_BIN), *(folder / "prometheus" for folder in also)):
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("prometheus")
    if found is None:
        raise RunleaseError("the prometheus server is not installed: apt-get install "
                            "prometheus (scripts/install-tools does)")
    return found


def config(jobs: Mapping[str, Sequence[str]], *, rule_files: Sequence[str] = (),
           interval_s: float = 5.0,
           keep: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A prometheus.yml: one scrape job per name, its host:port targets;
    `keep[job]` a regex of the metric names kept from that job."""
    scrape_configs = []
    for job, targets in jobs.items():
        job_config: dict[str, Any] = {"job_name": job,
                                      "static_configs": [{"targets": list(targets)}]}
        if keep and job in keep:
            job_config["metric_relabel_configs"] = [
                {"source_labels": ["__name__"], "regex": keep[job], "action": "keep"}]
        scrape_configs.append(job_config)
    interval = f"{int(interval_s * 1000)}ms"
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": list(rule_files), "scrape_configs": scrape_configs}


class PrometheusServer:
    """`prometheus` on 127.0.0.1:port with its config, rules and data in `folder`."""

    def __init__(self, folder: Path, port: int, jobs: Mapping[str, Sequence[str]], *,
                 rules: str | None = None, interval_s: float = 5.0,
                 keep: Mapping[str, str] | None = None, binary: str | None = None) -> None:
        self.binary = binary or prometheus_binary()
        self.folder = folder
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        folder.mkdir(parents=True, exist_ok=True)
        rule_files = []
        if rules is not None:
            (folder / "alerts.yaml").write_text(rules, encoding="utf-8")
            rule_files.append(str(folder / "alerts.yaml"))
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config(
            jobs, rule_files=rule_files, interval_s=interval_s, keep=keep), sort_keys=False))
        self.log_path = folder / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = 30.0) -> PrometheusServer:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, f"--config.file={self.folder / 'prometheus.yml'}",
                 f"--storage.tsdb.path={self.folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.proc.poll() is not None:
                raise RunleaseError(f"prometheus exited ({self.proc.returncode}): "
                                    f"{self.log()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RunleaseError(f"prometheus not ready in {timeout_s} s: "
                                    f"{self.log()[-2000:]}")
            time.sleep(0.1)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>: its `data`."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            body = json.loads(answer.read())
        if body.get("status") != "success":
            raise RunleaseError(f"prometheus answered {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series (vector), or the one scalar as a series."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = (data["result"] if data["resultType"] == "vector"
                                        else [{"metric": {}, "value": data["result"]}])
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def stop(self) -> None:
        """Idempotent: SIGTERM, then SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
