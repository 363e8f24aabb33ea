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
from pathlib import Path
from typing import Any, TypeVar

import httpx
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
from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
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
    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(check)
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
        "input": {"tokens": tokens, "pause_s": 0.5,
                  "steps": [{"shell": ["sh", "-c", "echo checked out; echo tests pass"]},
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
    wait(driver, "the shell step's output", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#events li[data-kind="tool.output"] details'))
    wait(driver, "the run to end done", lambda d: status_of(d) == "done")
    wait(driver, "the stream's end", lambda d: d.find_element(By.ID, "events")
         .get_attribute("data-ended") == "done")
    assert not driver.find_elements(By.CSS_SELECTOR, "#events .streaming")  # message complete
    wait(driver, "the durable steps", lambda d: len(d.find_elements(
        By.CSS_SELECTOR, "#run-steps details.step")) == 2)
    output = driver.find_element(By.CSS_SELECTOR, '#events li[data-kind="tool.output"] details')
    output.find_element(By.TAG_NAME, "summary").click()  # collapsible: opens on click
    assert "tests pass" in output.find_element(By.TAG_NAME, "pre").text
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
    dead = submit(api, "acme", {"input": {"fail_until_file": str(gate),
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
    driver.get(f"{api.url}/ui/pools")
    assert "1 / no limit" in driver.page_source
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
