"""The issue's path to done: `runlease dev --demo` prints the console's URL
and tokens; signing in with a printed token shows the demo's runs, and the
live table follows them to their end."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runlease.db.embedded import free_port
from tests.integration.test_dev_and_cli import postgres_pids
from tests.support.proc import ROOT
from tests.support.waiting import until_sync

pytestmark = pytest.mark.slow


@pytest.fixture
def demo() -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    folder = Path(tempfile.mkdtemp(prefix="runlease-demo-test-"))
    folder.chmod(0o755)  # PostgreSQL runs as its own user
    log = folder / "dev.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("DATABASE_URL", None)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runlease", "dev", "--demo", "--data-dir",
             str(folder / "data"), "--port", str(free_port()), "--workers", "1"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log, proc
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pid in postgres_pids(folder):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def printed(log: Path, pattern: str) -> str:
    match = re.search(pattern, log.read_text(errors="replace"), re.M)
    assert match, f"{pattern!r} not printed:\n{log.read_text(errors='replace')[-3000:]}"
    return match.group(1)


def test_demo_prints_a_url_and_tokens_that_sign_in_and_show_runs_live(
        demo: tuple[Path, subprocess.Popen[bytes]]) -> None:
    demo_log, proc = demo

    def banner() -> bool:
        text = demo_log.read_text(errors="replace")
        assert proc.poll() is None, f"runlease dev --demo exited:\n{text[-3000:]}"
        return "token      admin: " in text

    until_sync(banner, timeout_s=90, what="runlease dev --demo to print its banner")
    console = printed(demo_log, r"^console +(http://\S+/ui/)")
    acme = printed(demo_log, r"^token +acme: (\S+)")
    base = console.removesuffix("/ui/")
    with httpx.Client(base_url=base, timeout=10) as client:
        assert client.get("/ui/").status_code == 303  # no session: to the sign-in page
        signed = client.post("/ui/login", data={"token": acme})
        assert (signed.status_code, signed.headers["location"]) == (303, "/ui/runs")

        def acme_runs() -> list[str]:
            return re.findall(r'data-run="([0-9a-f-]{36})"', client.get("/ui/runs/table").text)

        until_sync(lambda: len(acme_runs()) == 4, timeout_s=60, what="acme's 4 demo runs")
        page = client.get("/ui/runs")
        assert 'hx-trigger="every 3s"' in page.text  # the table follows them live
        # The live fragment sees them finish (the flaky one after its retry).
        until_sync(lambda: client.get("/ui/runs/table", params={"status": "done"}).text
                   .count('data-run="') == 4, timeout_s=120, what="acme's runs to finish")
        table = client.get("/ui/runs/table").text
        assert re.search(r'class="badge done" href="[^"]*">done <b>4</b>', table)
        run = client.get(f"/ui/runs/{acme_runs()[0]}")
        assert run.status_code == 200
        assert 'id="attempts"' in run.text
        # Another tenant's demo runs are not acme's to see.
        assert "globex" not in client.get("/ui/runs").text
    # The banner's `try curl` is a tenant that owns demo runs (not an empty list).
    assert printed(demo_log, r"^try +curl -H 'Authorization: Bearer (\S+)'") == acme
    tried = httpx.get(f"{base}/v1/runs", headers={"Authorization": f"Bearer {acme}"})
    assert len(tried.json()["items"]) == 4
    # The ids the demo prints are whole: `runs show` and the console take them.
    until_sync(lambda: "dead letters (admin view)" in demo_log.read_text(errors="replace"),
               timeout_s=120, what="the demo's summary")
    shown = set(re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                           demo_log.read_text(errors="replace")))
    assert {r["id"] for r in tried.json()["items"]} <= shown
    # One run asked a person for approval (waiting, holding no worker), and
    # the demo answered it as a person would; it then finished.
    approved = printed(demo_log, r"^run (\S+) asked 'Deploy to production\?': approved")
    admin = printed(demo_log, r"^token +admin: (\S+)")
    ended = httpx.get(f"{base}/v1/runs/{approved}",
                      headers={"Authorization": f"Bearer {admin}"}).json()
    assert ended["status"] == "done"
    assert ended["attempts"] == 1
