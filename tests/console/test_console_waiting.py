"""The console and people (issue 28), in a real Chromium: a run waiting for
an approval shows its prompt with Approve and Deny; Approve resumes it; a
finished run is rerun from a step."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.console.test_console_browser import (  # noqa: F401 - fixtures
    TOKENS,
    browser,
    shot,
    sign_in,
    stack,
    status,
    status_of,
    submit,
    wait,
)
from tests.support.api_process import ApiProcess
from tests.support.waiting import until_sync


def test_approve_a_waiting_run_and_rerun_it_from_a_step(stack: ApiProcess,  # noqa: F811
                                                         browser: WebDriver) -> None:  # noqa: F811
    run_id = submit(stack, "acme", {"input": {"steps": [
        {"emit": {"text": "planned"}},
        {"input": {"name": "deploy", "prompt": "Deploy <b>v2</b> to production?",
                   "schema": {"type": "boolean"}, "timeout_s": 3600}},
        {"emit": {"text": "deployed"}}]}})
    until_sync(lambda: status(stack, run_id) == "waiting", what="the run to wait")
    sign_in(browser, stack, TOKENS["acme"])
    browser.get(f"{stack.url}/ui/runs/{run_id}")
    wait(browser, "the waiting badge", lambda d: status_of(d) == "waiting")
    form = wait(browser, "the input form",
                lambda d: d.find_element(By.CSS_SELECTOR, "#run-inputs form[data-name=deploy]"))
    prompt = form.find_element(By.CSS_SELECTOR, "pre.prompt")
    assert prompt.text == "Deploy <b>v2</b> to production?"  # shown as text, not markup
    assert form.find_element(By.CSS_SELECTOR, "button.deny").text == "Deny"
    shot(browser, "waiting")
    form.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait(browser, "the notice", lambda d: "Answered" in d.find_element(By.TAG_NAME,
                                                                        "body").text)
    until_sync(lambda: status(stack, run_id) == "done", what="the approved run to finish")
    # Rerun it from the approval: the step before it is copied, not run again.
    browser.get(f"{stack.url}/ui/runs/{run_id}")
    wait(browser, "the done badge", lambda d: status_of(d) == "done")
    browser.find_element(By.NAME, "from_step").send_keys("input:deploy")
    browser.find_element(By.ID, "rerun-run").click()
    wait(browser, "the rerun's page",
         lambda d: "/ui/runs/" in d.current_url and run_id not in d.current_url)
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "This run is a rerun" in body
    assert run_id in body
    rerun_id = browser.current_url.split("/ui/runs/")[1].split("?")[0]
    until_sync(lambda: status(stack, rerun_id) == "waiting", what="the rerun to ask again")
