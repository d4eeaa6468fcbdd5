"""The web console in a real browser (issue 34): headless Chromium (Debian's
``chromium`` and ``chromium-driver``, installed by ``scripts/testbed``) driven by
Selenium against a real ``relay start`` worker on the embedded broker, bound
beyond loopback with a token. Screenshots go to ``test-artifacts/console/``
(git-ignored; ``docs/console.md`` shows copies).

One worker, one story: a request without the token is refused; after signing in,
the overview's charts render with data; the failing handler's run appears with its
error and links to its trace; a POST without the CSRF token is refused; the dead
letter is replayed from the page and the handler runs."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.e2e.embedded_support import EmbeddedWorkers, admin_env, no_redis_env
from tests.e2e.failure_support import free_port
from tests.e2e.flaky_function import FAILING_FOR_S, FUNCTION, write_flaky_function
from tests.e2e.harness import RelayWorker, run_relay, wait_until
from tests.e2e.test_embedded_dlq_replay_e2e import dead_letter_of, dead_letters, publish

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
TOKEN = "console-e2e-token-7f3a"
SECRET = "console-token"
PAGE_WAIT_S = 30.0


@pytest.fixture
def browser() -> Iterator[Any]:
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.fail("chromium and chromium-driver are missing: run scripts/testbed")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu"):
        options.add_argument(arg)
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    chrome.set_page_load_timeout(PAGE_WAIT_S)
    try:
        yield chrome
    finally:
        chrome.quit()


def shot(browser: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def start_worker(embedded_worker: EmbeddedWorkers, tmp_path: Path, port: int) -> RelayWorker:
    state = tmp_path / "console-state"
    done = run_relay(["secret", "set", SECRET], no_redis_env(RELAY_STATE_DIR=str(state)),
                     stdin=TOKEN)
    assert done.returncode == 0, done.stderr
    return embedded_worker(env={
        "RELAY_STATE_DIR": str(state),
        "CONSOLE_ADDR": f"0.0.0.0:{port}",
        "CONSOLE_TOKEN_SECRET": SECRET,
    })


def page_text(browser: Any, url: str) -> str:
    browser.get(url)
    return str(browser.find_element("tag name", "body").text)


def test_the_console_in_a_browser(
    embedded_worker: EmbeddedWorkers, functions_dir: Path, broker_file: Path,
    tmp_path: Path, browser: Any,
) -> None:
    write_flaky_function(functions_dir)
    port = free_port()
    worker = start_worker(embedded_worker, tmp_path, port)
    worker.wait_for(rf"msg=function_prepared function={FUNCTION} ", timeout=180)
    base = f"http://127.0.0.1:{port}"
    for n in range(10, 16):
        publish(worker, {"kind": "flaky", "n": n, "fail_until": 0})
    until = time.time() + FAILING_FOR_S
    failing = publish(worker, {"kind": "flaky", "n": 1, "fail_until": until})
    entry = dead_letter_of(broker_file, failing)

    # bound beyond loopback: nothing without the token
    assert "needs its access token" in page_text(browser, base + "/")
    shot(browser, "refused-without-token")
    browser.get(base + "/login")
    browser.find_element("name", "token").send_keys(TOKEN)
    browser.find_element("css selector", "form button").click()
    wait_until(lambda: "Overview" in browser.title, PAGE_WAIT_S, "the overview after sign-in")

    # the overview's charts render with data (the run history flushes every second)
    def charted() -> bool:
        browser.get(base + "/")
        data = json.loads(browser.find_element("id", "chart-data").get_attribute("textContent"))
        drawn = int(browser.execute_script(
            "return document.querySelectorAll('.chart[data-drawn=yes] canvas').length"))
        hour = data["hour"]
        return bool(sum(hour["events_s"]) > 0 and sum(hour["failed"]) > 0 and drawn >= 8)

    wait_until(charted, PAGE_WAIT_S, "charts with data")
    shot(browser, "overview")
    functions = page_text(browser, base + "/functions")
    assert FUNCTION in functions
    assert "ready" in functions
    shot(browser, "functions")

    # the failing handler's run, with its error and a link to the message's trace
    def failed_run() -> bool:
        return "failing until fail_until" in page_text(browser, base + "/runs?outcome=exhausted")

    wait_until(failed_run, PAGE_WAIT_S, "the exhausted run on the runs page")
    shot(browser, "runs")
    browser.find_element("link text", failing).click()
    trace = browser.find_element("id", "trace").text
    assert f"Message:      {failing}" in trace
    assert entry in trace
    shot(browser, "trace")

    # a POST without the CSRF token is refused (from the signed-in browser itself)
    status = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "fetch('/dlq/remove', {method: 'POST', body: new URLSearchParams("
        f"{{id: '{entry}', confirm: 'yes'}})}}).then(r => done(r.status));"
    )
    assert status == 403
    assert entry in dead_letters(broker_file)

    # replayed from the page once the handler succeeds: it runs and the entry goes
    wait_until(lambda: time.time() > until, FAILING_FOR_S + 5, "fail_until to pass")
    browser.get(base + "/dlq")
    shot(browser, "dead-letters")
    browser.find_element("css selector", f"input[name=id][value='{entry}']").click()
    browser.find_element("id", "replay-selected").click()
    assert "queued 1 replay" in browser.find_element("id", "notice").text
    worker.wait_for(r"flaky ok 1$", timeout=120)
    wait_until(lambda: entry not in dead_letters(broker_file), 30, "the entry to be removed")
    wait_until(lambda: "replayed" in page_text(browser, base + "/dlq"), PAGE_WAIT_S,
               "the replay's outcome on the page")
    shot(browser, "replayed")
    assert run_relay(["dlq", "ls"], admin_env(worker)).stdout.strip().startswith("No dead")
