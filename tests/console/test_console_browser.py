"""The web console in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, installed by scripts/install-tools), driven by Selenium
through /usr/bin/chromedriver (never a downloaded driver), against a real
`runlease api` process and a real worker process.

Each page's screenshot is saved under docs/img/console-*.png (docs/console.md
shows them). Missing chromium skips here, and fails in CI (CI=true).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg
import pytest

from tests.support.api import ADMIN_TOKEN, TOKENS
from tests.support.api_process import ApiProcess
from tests.support.proc import ROOT, WorkerProcess
from tests.support.waiting import until_sync

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SHOTS = ROOT / "docs" / "img"
WAIT_S = 30

T = TypeVar("T")

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    why = f"{CHROMIUM} or {CHROMEDRIVER} missing: run scripts/install-tools"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)

from selenium import webdriver  # noqa: E402 - only once chromium is known to be there
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def stack(db_url: str, tmp_path: Path) -> Iterator[ApiProcess]:
    api = ApiProcess(db_url, tmp_path).start()
    worker = WorkerProcess(db_url, tmp_path, "w", {
        "agent": "tests.console.agents:agent", "poll_interval_s": 0.2, "concurrency": 4,
        "heartbeat_interval_s": 1, "lease_s": 10}).start()
    try:
        yield api
    finally:
        worker.cleanup()
        api.cleanup()


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--lang=en-US", "--disable-extensions"):
        options.add_argument(arg)
    # A driver path given to Service: Selenium skips Selenium Manager (which
    # would look for, and may download, a browser and driver).
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)),
                              options=options)
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, what: str, check: Callable[[WebDriver], T]) -> T:
    """Until `check` holds. The console re-renders live parts of a page while
    a check reads them, so an element found a moment ago may be gone: that
    is one more poll, not a failure (as an element not there yet is)."""
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1,
                             ignored_exceptions=(NoSuchElementException,
                                                 StaleElementReferenceException)).until(check)
    except Exception as exc:
        raise AssertionError(f"waited {WAIT_S} s for {what}; page:\n"
                             f"{driver.find_element(By.TAG_NAME, 'body').text[:3000]}") from exc


def shot(driver: WebDriver, name: str) -> None:
    """The whole page (up to 2400 px tall), from its top."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    size = driver.get_window_size()
    driver.execute_script("window.scrollTo(0, 0);")
    height = driver.execute_script("return document.documentElement.scrollHeight;")
    driver.set_window_size(size["width"], min(max(int(height) + 140, size["height"]), 2400))
    try:
        driver.save_screenshot(str(SHOTS / f"console-{name}.png"))
    finally:
        driver.set_window_size(size["width"], size["height"])


def submit(api: ApiProcess, who: str, body: dict[str, Any]) -> str:
    token = ADMIN_TOKEN if who == "admin" else TOKENS[who]
    r = httpx.post(f"{api.url}/v1/runs", json=body,
                   headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def status(api: ApiProcess, run_id: str) -> str:
    r = httpx.get(f"{api.url}/v1/runs/{run_id}",
                  headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    return str(r.json()["status"])


def sign_in(driver: WebDriver, api: ApiProcess, token: str) -> None:
    driver.get(f"{api.url}/ui/")
    wait(driver, "the sign-in page", lambda d: d.current_url.endswith("/ui/login"))
    field = driver.find_element(By.NAME, "token")
    field.send_keys(token)
    field.submit()
    wait(driver, "the runs page", lambda d: d.current_url.endswith("/ui/runs"))


def status_of(driver: WebDriver) -> str:
    # Read in one script: the summary is swapped by htmx every 2 s, and an
    # element found before a swap is stale after it.
    return str(driver.execute_script(
        "var el = document.getElementById('run-status'); return el ? el.textContent : '';"))


def confirm(driver: WebDriver) -> None:
    alert = wait(driver, "the confirmation", lambda d: d.switch_to.alert)
    alert.accept()


def test_watch_cancel_and_redrive_in_a_real_browser(stack: ApiProcess, browser: WebDriver,
                                                    tmp_path: Path) -> None:
    api, driver = stack, browser
    sign_in(driver, api, TOKENS["acme"])
    assert "No runs yet" in driver.page_source
    shot(driver, "empty")
    driver.execute_script("window.__notReloaded = true;")

    # Runs submitted after the page loaded appear without a reload.
    hostile = submit(api, "acme", {"input": {
        "prompt": "<script>document.title='pwned'</script><img src=x "
                  "onerror=\"document.title='pwned'\">"}})
    for i in range(3):
        submit(api, "acme", {"input": {"steps": [{"emit": {"text": f"quick {i}"}}]}})
    wait(driver, "the new runs in the table",
         lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-run="{hostile}"]'))
    tokens = ["The ", "model ", "streams ", "its ", "answer ", "to ", "the ", "console, ",
              "one ", "token ", "after ", "another, ", "token ", "by ", "token. "]
    streamed = submit(api, "acme", {
        "title": "Check out the branch and run its tests",
        "budget": {"max_tokens": 5000, "max_cost": 0.05},
        "input": {"tokens": tokens, "pause_s": 0.5,
                  "steps": [{"shell": ["sh", "-c", "echo checked out; sleep 2; echo tests pass"]},
                            {"usage": {"input_tokens": 1200, "output_tokens": 340,
                                       "cost": 0.0125}},
                            {"emit": {"text": "all done"}}]}})
    wait(driver, "the streaming run in the table",
         lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-run="{streamed}"]'))
    assert driver.execute_script("return window.__notReloaded === true;")
    shot(driver, "runs")

    # Its page: streamed tokens arrive while it runs, then tool blocks, then done.
    driver.find_element(By.CSS_SELECTOR, f'a[href="/ui/runs/{streamed}"]').click()
    wait(driver, "the run page", lambda d: d.current_url.endswith(f"/ui/runs/{streamed}"))
    message = wait(driver, "the first streamed tokens", lambda d: d.find_element(
        By.CSS_SELECTOR, '#events li[data-kind="message.delta"] pre'))
    first = message.text
    assert first, "the streamed message block is empty"
    assert "token." not in first, "the whole message came at once: nothing was streamed"
    wait(driver, "more tokens", lambda d: len(message.text) > len(first))
    wait(driver, "the last token", lambda d: "by token." in message.text)
    wait(driver, "the tool call block", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#events li[data-kind="tool.call"] details'))
    # The tool's output is open while it streams: its first line shows, the
    # run still running, before the tool has printed its last.
    output = wait(driver, "the shell step's first output line", lambda d: next(
        (e for e in d.find_elements(By.CSS_SELECTOR,
                                    '#events li[data-kind="tool.output"] details[open]')
         if "checked out" in e.find_element(By.TAG_NAME, "pre").text), None))
    assert "tests pass" not in output.find_element(By.TAG_NAME, "pre").text
    assert status_of(driver) == "leased"
    wait(driver, "the run to end done", lambda d: status_of(d) == "done")
    wait(driver, "the stream's end", lambda d: d.find_element(By.ID, "events")
         .get_attribute("data-ended") == "done")
    assert not driver.find_elements(By.CSS_SELECTOR, "#events .streaming")  # message complete
    wait(driver, "the durable steps", lambda d: len(d.find_elements(
        By.CSS_SELECTOR, "#run-steps details.step")) == 3)
    output = driver.find_element(By.CSS_SELECTOR, '#events li[data-kind="tool.output"] details')
    assert "tests pass" in output.find_element(By.TAG_NAME, "pre").text
    output.find_element(By.TAG_NAME, "summary").click()  # collapsible: closes on click
    assert output.get_attribute("open") is None
    output.find_element(By.TAG_NAME, "summary").click()  # and opens again, for the picture
    driver.execute_script("document.activeElement.blur();")
    # Its title, usage against its budget, and the tool's duration in the timeline.
    assert driver.find_element(By.ID, "run-title").text == \
        "Check out the branch and run its tests"
    wait(driver, "the usage against the budget", lambda d: "1,540 (1,200 in, 340 out)" in
         d.find_element(By.ID, "budget").text)
    assert "30.8 %" in driver.find_element(By.ID, "budget").text  # 1,540 of 5,000
    assert driver.find_elements(By.CSS_SELECTOR, "#timeline .tl-row.tool .tl-bar")
    time_el = driver.find_element(By.CSS_SELECTOR, "#run-summary time")
    assert str(time_el.get_attribute("title")).endswith("UTC")  # the UTC value on hover
    assert driver.find_element(By.ID, "tail-cmd").get_attribute("value") == \
        f"runlease runs tail {streamed}"
    shot(driver, "run")

    # A hostile input is shown as text: no script ran, no image handler fired.
    driver.get(f"{api.url}/ui/runs/{hostile}")
    wait(driver, "the hostile run's page", lambda d: d.find_elements(By.ID, "run-status"))
    assert "<script>document.title='pwned'</script>" in driver.find_element(
        By.ID, "run-input").text
    assert driver.title != "pwned"
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert.text  # noqa: B018 - reading it is the check

    # Cancel a running run from its page: it ends cancelled.
    long_run = submit(api, "acme", {"input": {"steps": [
        {"emit": {"text": "starting a long job"}}, {"sleep": 600}]}})
    driver.get(f"{api.url}/ui/runs/{long_run}")
    wait(driver, "the long run to start", lambda d: status_of(d) == "leased")
    wait(driver, "its first event", lambda d: "starting a long job" in
         d.find_element(By.ID, "events").text)
    driver.find_element(By.ID, "cancel-run").click()
    confirm(driver)
    wait(driver, "the cancel notice", lambda d: "Cancel requested" in d.page_source)
    wait(driver, "the run to end cancelled", lambda d: status_of(d) == "cancelled")

    # As admin: a dead run, redriven from its page, runs again and ends done.
    gate = tmp_path / "gate"
    dead = submit(api, "acme", {"title": "Publish once the gate opens",
                                "input": {"fail_until_file": str(gate),
                                          "steps": [{"emit": {"text": "made it"}}]}})
    driver.find_element(By.CSS_SELECTOR, ".signout button").click()
    wait(driver, "the sign-in page", lambda d: d.current_url.endswith("/ui/login"))
    sign_in(driver, api, ADMIN_TOKEN)
    until_sync(lambda: status(api, dead) == "dead", timeout_s=WAIT_S, what="the run to die")
    driver.get(f"{api.url}/ui/dead")
    shot(driver, "dead")
    driver.find_element(By.CSS_SELECTOR, f'a[href="/ui/runs/{dead}"]').click()
    wait(driver, "the dead run's page", lambda d: status_of(d) == "dead")
    assert "gate_closed" in driver.find_element(By.CSS_SELECTOR, ".failure").text
    gate.write_text("open")
    driver.find_element(By.ID, "redrive-run").click()
    confirm(driver)
    wait(driver, "the redrive notice", lambda d: "Redriven" in d.page_source)
    wait(driver, "the redriven run to end done", lambda d: status_of(d) == "done")
    wait(driver, "the redrive in the attempts", lambda d: "redriven" in str(d.execute_script(
        "return document.querySelector('table.lifecycle').textContent;")))

    # The admin's pages: every tenant's runs, pools and workers.
    busy = submit(api, "acme", {"input": {"steps": [{"sleep": 600}]}})
    submit(api, "globex", {"input": {"steps": [{"emit": {"text": "hi"}}]}})
    until_sync(lambda: status(api, busy) == "leased", timeout_s=WAIT_S,
               what="the busy run leased")
    # A pool with a run ready and no worker serving it is flagged.
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    assert httpx.put(f"{api.url}/v1/pools/nightly", json={}, headers=admin,
                     timeout=10).status_code == 200
    submit(api, "acme", {"pool": "nightly", "title": "Nightly index rebuild",
                         "input": {"steps": [{"emit": {"text": "rebuilt"}}]}})
    driver.get(f"{api.url}/ui/pools")
    assert "1 / no limit" in driver.page_source
    flag = driver.find_element(By.ID, "unserved-nightly")
    assert "No live worker serves this pool" in flag.text
    assert not driver.find_elements(By.ID, "unserved-default")  # pod-w serves default
    shot(driver, "pools")
    driver.get(f"{api.url}/ui/workers")
    assert "pod-w" in driver.find_element(By.TAG_NAME, "main").text
    shot(driver, "workers")
    driver.get(f"{api.url}/ui/runs?tenant=acme")
    shot(driver, "admin-runs")
    httpx.post(f"{api.url}/v1/runs/{busy}/cancel",
               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)


def test_the_console_on_a_phone_with_the_keyboard(stack: ApiProcess,
                                                  browser: WebDriver) -> None:
    """Readable on a narrow screen (nothing wider than the viewport but the
    tables' own scrolling boxes), and usable with the keyboard alone: sign
    in, Tab to a run, Enter opens it."""
    browser.set_window_size(390, 844)
    run_id = submit(stack, "acme", {"input": {"steps": [{"emit": {"text": "from a phone"}}]}})
    browser.get(f"{stack.url}/ui/login")
    # The token field takes the focus by itself (autofocus), once the page is
    # laid out: keys typed before that are lost (seen in CI: half a token).
    wait(browser, "the token field to have the focus",
         lambda d: d.switch_to.active_element.get_attribute("id") == "token")
    keys = ActionChains(browser)
    keys.send_keys(TOKENS["acme"] + Keys.ENTER).perform()
    wait(browser, "the runs page", lambda d: d.current_url.endswith("/ui/runs"))
    wait(browser, "the run in the table",
         lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-run]"))
    overflow = browser.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
    assert overflow <= 0, f"the page is {overflow}px wider than a phone's screen"
    shot(browser, "phone")
    for _ in range(40):
        keys.send_keys(Keys.TAB).perform()
        focused = browser.switch_to.active_element.get_attribute("href") or ""
        if focused.endswith(f"/ui/runs/{run_id}"):
            break
    else:
        raise AssertionError("Tab never reached the run's link")
    keys.send_keys(Keys.ENTER).perform()
    wait(browser, "the run's page", lambda d: d.current_url.endswith(f"/ui/runs/{run_id}"))


def bars_drawn(driver: WebDriver) -> list[dict[str, Any]]:
    """Each timeline row as drawn: its label, and where its bar is on its
    track (left and width as fractions of the track's width), from the
    layout the browser computed."""
    return list(driver.execute_script("""
        return Array.from(document.querySelectorAll('#timeline li.tl-row')).map(function (li) {
          var track = li.querySelector('svg.tl-track').getBoundingClientRect();
          var bar = li.querySelector('rect.tl-bar').getBoundingClientRect();
          return {kind: li.getAttribute('data-kind'),
                  label: li.querySelector('.tl-label').firstChild.textContent.trim(),
                  left: (bar.left - track.left) / track.width, width: bar.width / track.width};
        });"""))


def stored_times(db_url: str, run_id: str) -> dict[str, Any]:
    """What the database holds of the run's times, read directly."""
    with psycopg.connect(db_url) as conn:
        created, finished, holders = conn.execute(
            "SELECT created_at, finished_at, holders FROM agent_runs WHERE id = %s",
            (run_id,)).fetchone()
        steps = dict(conn.execute("SELECT step_key, created_at FROM agent_run_steps "
                                  "WHERE run_id = %s", (run_id,)).fetchall())
        events = conn.execute("SELECT kind, data, created_at FROM agent_run_events "
                              "WHERE run_id = %s AND kind IN ('run.retrying', 'tool.exit') "
                              "ORDER BY seq", (run_id,)).fetchall()
    return {"created": created, "finished": finished, "steps": steps,
            "claims": [datetime.fromisoformat(h["at"]) for h in holders],
            "retrying": [at for kind, _, at in events if kind == "run.retrying"],
            "exits": [(data, at) for kind, data, at in events if kind == "tool.exit"]}


def test_time_and_money_in_a_real_browser(stack: ApiProcess, browser: WebDriver,
                                          db_url: str) -> None:
    """The timeline's bars, in order and to scale against the stored times; a
    retried run's attempts and the wait between them; the runs list's titles,
    durations, several statuses at once and an id prefix; the usage page,
    a tenant's own usage only."""
    api, driver = stack, browser
    run_id = submit(api, "acme", {
        "title": "Re-index the search corpus", "backoff_base_s": 1,
        "input": {"steps": [{"sleep": 1}, {"shell": ["sh", "-c", "sleep 1.2; echo indexed"]},
                            {"fail": "retryable", "until_attempt": 2},
                            {"usage": {"input_tokens": 800, "output_tokens": 200,
                                       "cost": 0.004}},
                            {"sleep": 0.6}]}})
    hostile = submit(api, "acme", {"title": "<img src=x onerror=\"document.title='pwned'\">",
                                   "input": {"steps": [{"emit": {"text": "x"}}]}})
    untitled = submit(api, "acme", {"input": {"prompt": "Draft the release notes for "
                                                        "version 2.4 from the merged changes"}})
    submit(api, "globex", {"title": "globex's own", "input": {"steps": [
        {"usage": {"input_tokens": 99999, "output_tokens": 1, "cost": 9}}]}})
    until_sync(lambda: status(api, run_id) == "done", timeout_s=WAIT_S, what="the run done")
    until_sync(lambda: status(api, untitled) == "done", timeout_s=WAIT_S, what="runs done")
    sign_in(driver, api, TOKENS["acme"])

    # The runs list: titles (escaped), the first words of an untitled input, durations.
    wait(driver, "the runs", lambda d: d.find_elements(By.CSS_SELECTOR,
                                                       f'tr[data-run="{untitled}"]'))
    summary = driver.execute_script(
        "var out = {}; document.querySelectorAll('tr[data-run]').forEach(function (tr) {"
        " out[tr.getAttribute('data-run')] = [tr.querySelector('.run-summary').textContent,"
        " tr.querySelector('.took').textContent]; }); return out;")
    assert summary[run_id][0] == "Re-index the search corpus"
    assert summary[hostile][0] == "<img src=x onerror=\"document.title='pwned'\">"
    assert summary[untitled][0] == ("Draft the release notes for version 2.4 from the merged "
                                    "changes")
    assert driver.title != "pwned"
    assert summary[run_id][1].endswith(" s")
    shot(driver, "runs-titles")

    # Several statuses at once: tick done and cancelled.
    cancelled = submit(api, "acme", {"delay_s": 3600, "input": {}})
    httpx.post(f"{api.url}/v1/runs/{cancelled}/cancel",
               headers={"Authorization": f"Bearer {TOKENS['acme']}"}, timeout=10)
    driver.get(f"{api.url}/ui/runs")
    for value in ("done", "cancelled"):
        driver.find_element(By.CSS_SELECTOR, f'input[name="status"][value="{value}"]').click()
    driver.find_element(By.CSS_SELECTOR, "form.filters button[type=submit]").click()
    wait(driver, "the filtered table", lambda d: "status=cancelled" in d.current_url)
    shown = driver.execute_script(
        "return Array.from(document.querySelectorAll('tr[data-run]')).map("
        "function (tr) { return tr.getAttribute('data-status'); });")
    assert set(shown) == {"done", "cancelled"}
    assert shown.count("cancelled") == 1
    # An id prefix, as the CLI prints ids.
    field = driver.find_element(By.NAME, "q")
    field.send_keys(run_id[:13])
    for value in ("done", "cancelled"):  # untick: the prefix alone
        driver.find_element(By.CSS_SELECTOR, f'input[name="status"][value="{value}"]').click()
    field.submit()
    wait(driver, "the run found by its prefix", lambda d: d.find_elements(
        By.CSS_SELECTOR, f'tr[data-run="{run_id}"]'))

    # The run's page: two attempts, the wait between them, steps and a tool, to scale.
    driver.get(f"{api.url}/ui/runs/{run_id}")
    wait(driver, "the timeline", lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline rect"))
    drawn = bars_drawn(driver)
    times = stored_times(db_url, run_id)
    t0, t1 = times["created"], times["finished"]
    total = (t1 - t0).total_seconds()
    (claim1, claim2), (retried,) = times["claims"], times["retrying"]
    ((exit_data, exit_at),) = times["exits"]
    steps = times["steps"]
    tool_start = exit_at - timedelta(seconds=exit_data["duration_s"])
    expected = [("queued", "queued", t0, claim1), ("attempt", "attempt 1", claim1, retried),
                ("step", "step 0", claim1, steps["0"]), ("step", "step 1", steps["0"], steps["1"]),
                ("tool", "tool \u00b7 step 1", tool_start, exit_at),
                ("queued", "waiting to retry", retried, claim2),
                ("attempt", "attempt 2", claim2, t1),
                ("step", "step 3", claim2, steps["3"]), ("step", "step 4", steps["3"], steps["4"])]
    assert [(b["kind"], b["label"]) for b in drawn] == [(k, lbl) for k, lbl, _, _ in expected]
    for bar, (_kind, label, start, end) in zip(drawn, expected, strict=True):
        left = (start - t0).total_seconds() / total
        width = (end - start).total_seconds() / total
        # Proportional within rounding: a pixel or two of the track, and the
        # smallest width drawn (0.3 %) for an instant.
        assert abs(bar["left"] - left) < 0.01, (label, bar, left)
        assert abs(bar["width"] - max(width, 0.003)) < 0.01, (label, bar, width)
    # Drawn in order: each attempt after the one before, each step after its attempt's start.
    assert drawn[1]["left"] < drawn[6]["left"]
    assert drawn[2]["left"] <= drawn[3]["left"] <= drawn[4]["left"]
    assert "1,000 (800 in, 200 out)" in driver.find_element(By.ID, "budget").text
    shot(driver, "timeline")

    # Usage: acme's own, by day and pool, with a chart; globex's is not there.
    driver.get(f"{api.url}/ui/usage")
    wait(driver, "the usage table", lambda d: d.find_elements(By.ID, "usage-table"))
    main = driver.find_element(By.TAG_NAME, "main").text
    assert "1,000" in main
    assert "99,999" not in main
    assert "100,000" not in main
    bar = driver.find_element(By.CSS_SELECTOR, "#usage-chart rect.bar")
    assert bar.get_attribute("data-tokens") == "1000"
    assert bar.size["height"] > 50  # the tallest day: the whole plot
    driver.find_element(By.CSS_SELECTOR, ".signout button").click()
    sign_in(driver, api, ADMIN_TOKEN)
    driver.get(f"{api.url}/ui/usage")
    wait(driver, "the admin's usage", lambda d: "globex" in d.find_element(By.ID,
                                                                           "usage-table").text)
    shot(driver, "usage")
