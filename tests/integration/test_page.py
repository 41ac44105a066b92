"""The chat page in a real browser (Debian's chromium and chromium-driver, driven by
selenium): it lists the models, streams a reply as it comes, stops a long one (and the
server frees its slot: /metrics), shows reasoning collapsed, asks for the API key where one
is set and shows a model that cannot load as unavailable. A screenshot of the page is left in
the test's temporary directory. Without chromium, chromedriver or selenium the tests skip,
naming what is missing."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator

import httpx
import pytest

from tests.integration.conftest import RERANKER, SECRET, UNLOADABLE

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
WAIT_S = 60  # the longest a page condition is waited for (a loaded 2-core machine)
# headless Chromium as a test runs it: nothing fetched from elsewhere, no GPU, no sandbox
# (a container's root), a fresh profile (added per run)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1200,800")
SMOL = "smollm2-135m"
LIGHT = {"type": "function", "function": {"name": "light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}


def _missing() -> list[str]:
    missing = []
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        missing.append("chromium (apt-get install chromium)")
    if not shutil.which("chromedriver"):
        missing.append("chromedriver (apt-get install chromium-driver)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install selenium)")
    return missing


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator:
    missing = _missing()
    if missing:
        pytest.skip("the browser tests need " + ", ".join(missing))
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager: download nothing
    options = Options()
    options.binary_location = shutil.which("chromium") or shutil.which("chromium-browser")
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(options=options,
                              service=Service(executable_path=shutil.which("chromedriver")))
    yield driver
    driver.quit()


def _wait(driver, condition, message: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, message)


def _open(driver, url: str, model: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(url)
    _wait(driver, lambda d: any(o.get_attribute("value") == model for o in
                                d.find_elements(By.CSS_SELECTOR, "#model option")),
          f"{model} is not in the model list")
    Select(driver.find_element(By.ID, "model")).select_by_value(model)


def _send(driver, text: str, max_tokens: int) -> None:
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, "max-tokens")
    field.clear()
    field.send_keys(str(max_tokens))
    driver.find_element(By.ID, "prompt").send_keys(text)
    driver.find_element(By.ID, "send").click()


def _last_reply(driver):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, "li.turn.assistant")[-1]


def _metric(url: str, name: str, label: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    line = rf'^{name}{{[^}}]*"{re.escape(label)}"[^}}]*}} (\S+)'
    return sum(float(v) for v in re.findall(line, text, re.MULTILINE))


def test_page_streams_a_reply_and_stop_frees_the_slot(browser, serve_url, tmp_path) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, serve_url + "/", SMOL)
    # greedy: a long story (sampled, the model sometimes ends it in 20 tokens)
    browser.find_element(By.ID, "temperature").send_keys("0")
    _send(browser, "Tell me a long story about a cat.", 4000)
    reply = _last_reply(browser)
    content = reply.find_element(By.CSS_SELECTOR, ".content")
    stop = browser.find_element(By.ID, "stop")
    # text appears while the reply is still coming: it streams
    _wait(browser, lambda d: len(content.text.split()) >= 3 and stop.is_enabled(),
          "no streamed text while the reply was running")
    _wait(browser, lambda d: _metric(serve_url, "flm_running_sequences", SMOL) == 1,
          "the reply is not running on the worker")
    stop.click()
    stats = reply.find_element(By.CSS_SELECTOR, ".stats")
    _wait(browser, lambda d: "stopped" in stats.text, "the reply did not stop")
    assert browser.find_element(By.ID, "send").is_enabled() and not stop.is_enabled()
    _wait(browser, lambda d: _metric(serve_url, "flm_running_sequences", SMOL) == 0,
          "the worker still runs the stopped reply")
    browser.save_screenshot(str(tmp_path / "page.png"))
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_new_chat_during_a_reply_leaves_that_reply_out_of_it(browser, serve_url) -> None:
    """The new chat's first request holds its own message only: the reply cut short by
    "New chat" went into the new chat's history (the next request began with it)."""
    from selenium.webdriver.common.by import By

    _open(browser, serve_url + "/", SMOL)
    browser.find_element(By.ID, "temperature").send_keys("0")
    _send(browser, "Tell me a long story about a cat.", 4000)
    content = _last_reply(browser).find_element(By.CSS_SELECTOR, ".content")
    _wait(browser, lambda d: len(content.text.split()) >= 3, "no streamed text")
    browser.execute_script(  # the bodies the page sends from now on
        "window.sent = []; const f = window.fetch; window.fetch = (u, o) => "
        "{ if (o && o.body) window.sent.push(JSON.parse(o.body)); return f(u, o); };")
    browser.find_element(By.ID, "new-chat").click()
    send = browser.find_element(By.ID, "send")
    _wait(browser, lambda d: send.is_enabled(), "the stopped reply did not end")
    _send(browser, "Hello", 3)
    _wait(browser, lambda d: d.execute_script("return window.sent.length"), "nothing sent")
    [body] = browser.execute_script("return window.sent")
    assert body["messages"] == [{"role": "user", "content": "Hello"}]


def test_reply_shows_its_speed_and_reasoning_collapsed(browser, serve_url) -> None:
    from selenium.webdriver.common.by import By

    _open(browser, serve_url + "/", "tiny-gpt-oss")
    browser.find_element(By.ID, "new-chat").click()
    assert not browser.find_elements(By.CSS_SELECTOR, "li.turn")
    # a random model: JSON's grammar keeps its harmony output readable (reasoning, then JSON)
    browser.find_element(By.ID, "json-reply").click()
    browser.find_element(By.ID, "temperature").send_keys("0")
    _send(browser, "Lights?", 40)
    reply = _last_reply(browser)
    stats = reply.find_element(By.CSS_SELECTOR, ".stats")
    _wait(browser, lambda d: stats.text, "the reply did not end")
    assert re.search(r"\b\d+ tokens · [\d.]+ tokens/s · first token \d+ ms", stats.text), \
        reply.text
    reasoning = reply.find_element(By.CSS_SELECTOR, "details.reasoning")
    text = reply.find_element(By.CSS_SELECTOR, ".reasoning-text")
    assert reasoning.is_displayed() and not text.is_displayed()  # collapsed
    reasoning.find_element(By.TAG_NAME, "summary").click()
    _wait(browser, lambda d: text.is_displayed() and text.text, "reasoning does not open")


def test_page_asks_for_the_api_key_and_shows_an_unloadable_model(browser,
                                                                  serve_url) -> None:
    from selenium.webdriver.common.by import By

    browser.get(serve_url + "/secured/")
    key = browser.find_element(By.ID, "api-key")
    _wait(browser, lambda d: key.is_displayed(), "the page does not ask for the API key")
    key.send_keys(SECRET)
    browser.find_element(By.CSS_SELECTOR, "#key-form button").click()
    option = _wait(browser, lambda d: d.find_elements(
        By.CSS_SELECTOR, f'#model option[value="{UNLOADABLE}"]'), "no model list")[0]
    assert option.text == f"{UNLOADABLE} (unavailable)" and not option.is_enabled()
    assert "FooForCausalLM" in option.get_attribute("title")
    assert browser.find_element(By.ID, "model").get_attribute("value") == "flm-tiny"


def test_the_model_list_offers_chat_models_only(browser, serve_url) -> None:
    """The embedding model and the reranker the app serves are not offered for chat (their
    /v1/models cards say what they serve)."""
    from selenium.webdriver.common.by import By

    _open(browser, serve_url + "/", "flm-tiny")
    offered = {o.get_attribute("value")
               for o in browser.find_elements(By.CSS_SELECTOR, "#model option")}
    assert "tiny-gpt-oss" in offered and not offered & {"bert-tiny", RERANKER}


def test_tool_calls_show_as_they_stream(browser, serve_url) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, serve_url + "/", "tiny-gpt-oss")
    tools = browser.find_element(By.ID, "tools")
    tools.send_keys(json.dumps([LIGHT]))
    Select(browser.find_element(By.ID, "tool-choice")).select_by_value("required")
    browser.find_element(By.ID, "temperature").send_keys("0")
    _send(browser, "Lights?", 160)
    reply = _last_reply(browser)
    stats = reply.find_element(By.CSS_SELECTOR, ".stats")
    _wait(browser, lambda d: stats.text, "the reply did not end")
    [call] = reply.find_elements(By.CSS_SELECTOR, ".tool-call")
    name, _, arguments = call.text.partition("(")
    assert name == "light" and isinstance(json.loads(arguments[:-1])["on"], bool)
    assert stats.text.startswith("tool_calls")
