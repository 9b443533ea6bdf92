#!/usr/bin/env python3
"""The real app end to end: the Tauri binary in a real window (under Xvfb), driven through
tauri-driver + WebKitWebDriver with selenium, on the real SmolLM2 model and a real SQLite file.

    xvfb-run -a python3 tests/e2e_app.py APP_BINARY MODEL.gguf

Checks: a chat asked "What is the capital of France? Answer in one word." at temperature 0
streams an answer containing "Paris", which is in the SQLite file afterwards; a second chat
asked while the first streams a long answer gets its answer first; Stop keeps a partial
answer; the API turned on in Settings answers a real HTTP client and logs the request in the
window; a chat set to a remote OpenAI-compatible server (the app's own API, over HTTP) streams
its answer from there, and one set to an unreachable server shows a clear error; the API
stops answering when turned off; the window opens on an empty chat ready to type in; files are
chosen only in dialogs the app opens itself (a page script naming a path writes nothing, reads
nothing); a remote server's key is kept apart from the conversation; other families' test
models chat in the window as `rill run` does; a thinking model's reasoning streams into an open
Thinking block that folds when the answer starts, and is saved, and gpt-oss's analysis channel
does the same with no Think switch (it always reasons); an API client's tool calls,
kept as a conversation, show as call cards; a picture dropped into a chat is answered about,
saved, exported, imported and shown again after a restart (tests/e2e_images.py). Screenshots of the window
go to tests/screenshots/ (git-ignored).

The app's dialogs are answered through RILL_TEST_DIALOG (read by debug builds only): the test
writes the answer (a path, or nothing for cancel) into that file before it clicks.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.keys import Keys

from e2e_lib import App, free_port, wait_port
from e2e_speed import speed_up
from e2e_images import after_restart, images_chat, vision_model

QUESTION = "What is the capital of France? Answer in one word."
LONG = "Write a long story about a dragon who learns to paint. Make it at least ten paragraphs."
ROOT = Path(__file__).resolve().parent.parent


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The forecast for a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def tools_chat(app: App, d: webdriver.Remote, address: str, failures: list) -> None:
    body = json.dumps({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call0abcd", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call0abcd", "content": '{"forecast": ["sunny", "rain"]}'},
            {"role": "user", "content": "And in Rome?"},
        ],
        "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0, "max_tokens": 40,
    }).encode()
    request = urllib.request.Request(f"{address}/chat/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as r:
        call = json.load(r)["choices"][0]["message"]["tool_calls"][0]
    print(f"API tool call: {call['function']}")
    app.find('[aria-label="Close the settings"]').click()
    app.new_chat()  # the sidebar reads the conversations again
    # By its text in the page (WebDriver's rendered text of a sidebar row can be empty).
    chat_id = app.wait(lambda: d.execute_script(
        "const i = [...document.querySelectorAll('[data-testid=conversation-item]')]"
        "  .find((e) => e.textContent.includes('What is the weather in Paris?'));"
        "return i ? i.dataset.id : null;"), 30, "the API's tool chat is not in the sidebar")
    app.fresh(lambda: app.find(f'[data-testid="conversation-item"][data-id="{chat_id}"] button.conv-open').click())
    # The client's past call, and the model's.
    cards = lambda: d.find_elements(By.CSS_SELECTOR, '[data-testid="tool-call"]')
    app.wait(lambda: len(cards()) == 2, 30, "no call cards")
    names = app.fresh(lambda: [c.find_element(By.CSS_SELECTOR, '[data-testid="tool-call-name"]').text for c in cards()])
    result = app.fresh(lambda: app.tid("tool-result").text)
    last_args = app.fresh(lambda: cards()[1].find_element(By.CSS_SELECTOR, '[data-testid="tool-call-arguments"]').text)
    print(f"call cards: {names}; result card {result!r}; the model's call {last_args!r}")
    app.shot("app-tool-calls")
    if names != ["get_weather", "get_weather"]:
        failures.append(f"the saved calls are not shown as call cards: {names}")
    # (The card's heading is upper case on screen, as WebDriver reads it.)
    if "result of get_weather" not in result.lower() or "sunny" not in result:
        failures.append(f"the tool's result is not shown as its card: {result!r}")
    if json.loads(last_args) != json.loads(call["function"]["arguments"]):
        failures.append(f"the model's call card is not the call the client got: {last_args!r} vs {call}")


def think_thinking(app: App, d: webdriver.Remote, path: Path, db: Path, failures: list, label: str) -> None:
    """A thinking model's answer in the window: `label` names it in the picker. The
    DeepSeek-R1 template thinks on request (a Think switch); gpt-oss's harmony always
    reasons, in its analysis channel (no switch)."""
    harmony = label == "gpt-oss"
    app.tid("model-picker").click()
    rows = app.wait(lambda: [r for r in d.find_elements(By.CSS_SELECTOR, ".model-list li") if str(path) in r.text], 30,
                    f"{path.name} is not in the manager")
    rows[0].find_element(By.CSS_SELECTOR, "button").click()
    app.wait(lambda: label in app.tid("model-picker").text.lower(), 120, f"{path.name} did not load")
    if d.find_elements(By.CSS_SELECTOR, '[aria-label="Close the model manager"]'):
        d.find_element(By.CSS_SELECTOR, '[aria-label="Close the model manager"]').click()
    app.new_chat()
    app.set_field('[aria-label="Temperature value"]', "0")
    app.set_field("#max-tokens-field", "600")
    if harmony:
        if d.find_elements(By.CSS_SELECTOR, '[data-testid="param-think"]'):
            failures.append("a Think switch is shown for gpt-oss, which always reasons")
    else:
        # llama.cpp's DeepSeek-R1 template thinks when asked: the switch starts off.
        think = app.tid("param-think")
        if think.is_selected():
            failures.append("the Think switch of a template that thinks on request starts on")
        think.click()
    app.set_field("#thinking-budget-field", "300")
    # Every state the block shows, with whether it was open and its summary, as the page changes.
    d.execute_script(
        "window.__thought = [];"
        "new MutationObserver(() => document.querySelectorAll('[data-testid=thinking]').forEach((e) =>"
        "  window.__thought.push([e.dataset.state, e.open, e.querySelector('summary').textContent])))"
        ".observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});"
    )
    answer = app.ask("What is 17 times 3?")
    app.wait(lambda: app.status_of(answer) in ("done", "stopped"), 300, "the thinking answer did not finish")
    seen = d.execute_script("return window.__thought")
    thinking = [s for s in seen if s[0] == "thinking"]
    block = lambda: app.tid("thinking", app.find(f'[data-testid="message"][data-id="{answer}"]'))
    summary = app.fresh(lambda: block().find_element(By.CSS_SELECTOR, "summary").text)
    is_open = app.fresh(lambda: block().get_attribute("open"))
    print(f"{label} thinking: {len(thinking)} states seen while thinking, e.g. {thinking[-1:]}; at the end {summary!r}, open={is_open}")
    app.shot(f"app-thinking-{label}")
    if not thinking or not all(s[1] for s in thinking):
        failures.append(f"the Thinking block was not seen open while the model thought: {seen[:5]}")
    if not any(s[2].startswith("Thinking…") and "tokens" in s[2] for s in thinking):
        failures.append(f"the Thinking block did not count its tokens while streaming: {thinking[:5]}")
    # The budget is 300 tokens (this test model never ends its thought sooner by itself): a
    # shorter thought means the answer ran with a budget the panel did not show.
    if not summary.startswith("Thought for") or "· 300 tokens" not in summary or is_open:
        failures.append(f"the Thinking block did not fold to how long it thought: {summary!r}, open={is_open}")
    # Open it: its text is the saved reasoning; the answer is the rest.
    app.fresh(lambda: block().find_element(By.CSS_SELECTOR, "summary").click())
    app.wait(lambda: block().get_attribute("open") is not None, 30, "the Thinking block did not open on a click")
    shown = app.fresh(lambda: app.find('[data-testid="thinking-text"]', block()).text)
    with sqlite3.connect(db) as c:
        (content, reasoning, tokens) = c.execute(
            "SELECT content, reasoning, reasoning_tokens FROM messages WHERE id = ?", (int(answer),)).fetchone()
    print(f"saved reasoning: {reasoning[:60]!r}… ({tokens} tokens); content {content[:60]!r}…")
    markup = [m for m in ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "think>") if m in reasoning + content]
    if markup:
        failures.append(f"{label}: the answer's markup is shown as text: {markup}")
    if tokens != 300 or not reasoning.strip() or not content.strip():
        failures.append(f"the reasoning is not saved beside the answer: {tokens} tokens, {reasoning[:80]!r}, {content[:80]!r}")
    if " ".join(shown.split()) != " ".join(reasoning.split()):
        failures.append(f"the Thinking block does not show the saved reasoning: {shown[:80]!r} vs {reasoning[:80]!r}")


def main() -> int:
    app_binary, model = (Path(a).resolve() for a in sys.argv[1:3])
    work = Path(tempfile.mkdtemp(prefix="rill-e2e-"))
    db = work / "rill.db"
    env = dict(os.environ)
    env.update(
        RILL_DB=str(db),
        RILL_MODEL=str(model),
        RILL_MODELS_DIR=str(work / "models"),
        HF_HOME=str(work / "hf"),
        RILL_CONFIG_DIR=str(work / "config"),
        RILL_TEST_DIALOG=str(work / "dialog-answer"),
        RILL_LOG="info",
    )
    dialog_answer = lambda path: (work / "dialog-answer").write_text(f"{path}\n")
    # Two test models of other families in the models folder, for the manager to list and the
    # window to switch to (step 7).
    (work / "models").mkdir(parents=True)
    family_models = []
    for name in ("qwen3-test.Q8_0.gguf", "gemma3-test.Q8_0.gguf", "gpt-oss-test.MXFP4.gguf",
                 "deepseek-r1-qwen-test.Q8_0.gguf"):
        shutil.copy(ROOT / "models/test-models" / name, work / "models" / name)
        family_models.append(work / "models" / name)
    thinking_model, harmony_model = family_models.pop(), family_models.pop()
    seeing_model = vision_model(work / "models")  # step 10
    image_chat = None
    # SmolLM2 in the models folder too: the draft model the window suggests (step 6b).
    shutil.copy(model, work / "models" / model.name)
    port, native_port = free_port(), free_port()
    driver_bin = shutil.which("tauri-driver") or str(Path.home() / ".cargo/bin/tauri-driver")
    log = open(work / "tauri-driver.log", "w")
    tauri_driver = subprocess.Popen(
        [driver_bin, "--port", str(port), "--native-port", str(native_port), "--native-host", "127.0.0.1"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    failures = []
    try:
        wait_port(port, tauri_driver)
        wait_port(native_port, tauri_driver)  # WebKitWebDriver, started by tauri-driver
        options = webdriver.ChromeOptions()  # any Options object carries the capabilities
        options.set_capability("browserName", "wry")
        options.set_capability("tauri:options", {"application": str(app_binary)})
        d = webdriver.Remote(command_executor=f"http://127.0.0.1:{port}", options=options)
        d.set_window_size(1280, 800)
        app = App(d)
        try:
            # The test model is ready at start (RILL_MODEL).
            app.wait(lambda: "smollm2" in app.tid("model-picker").text.lower(), 120, "the model did not load")
            # The first screen is an empty chat with its composer focused: no click needed.
            app.wait(lambda: app.tid("composer").is_displayed(), 30, "the first screen has no composer")
            app.wait(lambda: d.switch_to.active_element.get_attribute("data-testid") == "composer", 30,
                     "the composer is not focused at start")
            app.shot("app-start")

            # Every status an answer shows, as the page changes (a short answer can stream and
            # finish between two reads of WebDriver's).
            d.execute_script(
                "window.__seen = [];"
                "new MutationObserver(() => document.querySelectorAll('[data-testid=message][data-role=assistant]')"
                "  .forEach((e) => window.__seen.push(e.dataset.id + ':' + e.dataset.status)))"
                ".observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['data-status']});"
            )

            # 1. One chat, temperature 0: "Paris" streams in, and is saved.
            app.set_field('[aria-label="Temperature value"]', "0")
            first = app.ask(QUESTION)
            app.wait(lambda: app.status_of(first) == "done", 300, "the answer did not finish")
            seen_streaming = f"{first}:streaming" in d.execute_script("return window.__seen")
            text = app.fresh(lambda: app.last_answer().text)
            print(f"answer: {text!r} (seen streaming: {seen_streaming})")
            if not seen_streaming:
                failures.append("the answer was never shown streaming")
            if "Paris" not in text:
                failures.append(f"the answer does not contain Paris: {text!r}")
            # The header shows the whole title when it fits.
            cut = d.execute_script("const h = document.querySelector('.chat-header h1'); return [h.textContent, h.scrollWidth > h.clientWidth]")
            print(f"chat header: {cut}")
            if cut[1] or not cut[0].startswith("What is the capital of France? Answer in one word"):
                failures.append(f"the chat header cuts a title that fits: {cut}")
            app.shot("app-answer")
            with sqlite3.connect(db) as c:
                rows = c.execute(
                    "SELECT m.content, m.status, m.completion_tokens FROM messages m WHERE m.id = ?", (int(first),)
                ).fetchall()
            print(f"stored: {rows}")
            if not rows or "Paris" not in rows[0][0] or rows[0][1] != "done" or not rows[0][2]:
                failures.append(f"the answer is not in the database as a finished answer: {rows}")

            # 2. The flow: a long answer streams in one chat; a short question in another
            #    chat gets its whole answer while the long one is still being written.
            app.new_chat()
            app.set_field("#max-tokens-field", "4000")
            long_id = app.ask(LONG)
            app.wait(lambda: len(app.last_answer().text) > 20, 120, "the long answer did not start")
            long_chat = app.find('[data-testid="conversation-item"].active').get_attribute("data-id")
            app.new_chat()
            short_id = app.ask(QUESTION)
            app.wait(lambda: app.status_of(short_id) == "done", 300, "the short answer did not finish")
            long_item = lambda: app.find(f'[data-testid="conversation-item"][data-id="{long_chat}"]')
            still_live = app.fresh(lambda: long_item().get_attribute("data-live") == "true")
            partial = app.fresh(lambda: long_item().text)
            short_text = app.fresh(lambda: app.last_answer().text)
            app.shot("app-flow")
            print(f"short answer: {short_text!r}; long chat still live: {still_live}; sidebar: {partial!r}")
            if not still_live:
                failures.append("the long answer ended before the short one: no flow")
            if "Paris" not in short_text:
                failures.append("the short answer does not contain Paris")
            with sqlite3.connect(db) as c:
                (long_status,) = c.execute("SELECT status FROM messages WHERE id = ?", (int(long_id),)).fetchone()
            print(f"long answer status in the database meanwhile: {long_status}")
            if still_live and long_status != "streaming":
                failures.append(f"a live answer is {long_status!r} in the database, not streaming")

            # Stop the long answer from its own chat; the partial answer is kept.
            app.fresh(lambda: long_item().find_element(By.CSS_SELECTOR, "button.conv-open").click())
            app.wait(lambda: app.status_of(long_id) in ("streaming", "stopped", "done"), 30)
            if app.status_of(long_id) == "streaming":
                app.stop(long_id)
                with sqlite3.connect(db) as c:
                    (status, content) = c.execute(
                        "SELECT status, content FROM messages WHERE id = ?", (int(long_id),)
                    ).fetchone()
                print(f"stopped answer kept: {status}, {len(content)} chars")
                if status != "stopped" or len(content) < 20:
                    failures.append(f"the stopped answer was not kept: {status} {content!r}")
            else:
                failures.append(f"the long answer was {app.status_of(long_id)} before Stop could be tried")
            app.shot("app-stopped")

            # Frame times while a long answer streams at full speed (recorded, not asserted:
            # BENCHMARKS.md). A requestAnimationFrame loop notes every frame's interval from the
            # question until the answer ends (at most 4,000 tokens, or three minutes).
            app.new_chat()
            app.set_field('[aria-label="Temperature value"]', "0")
            app.set_field("#max-tokens-field", "4000")
            d.execute_script(
                "window.__frames = []; window.__framesOn = true; let last = performance.now();"
                "const tick = (t) => { window.__frames.push(t - last); last = t;"
                "  if (window.__framesOn) requestAnimationFrame(tick); };"
                "requestAnimationFrame(tick);"
            )
            story = app.ask(LONG)
            try:
                app.wait(lambda: app.status_of(story) in ("done", "stopped"), 180)
            except TimeoutException:
                app.stop(story)
            frames = sorted(d.execute_script("window.__framesOn = false; return window.__frames"))
            with sqlite3.connect(db) as c:
                (tokens, chars) = c.execute(
                    "SELECT completion_tokens, length(content) FROM messages WHERE id = ?", (int(story),)
                ).fetchone()
            if frames:
                at = lambda q: frames[round((len(frames) - 1) * q)]
                print(f"frames while {tokens} tokens ({chars} characters) streamed: p50 {at(0.5):.1f} ms, "
                      f"p95 {at(0.95):.1f} ms, max {frames[-1]:.1f} ms over {len(frames)} frames")
            else:
                failures.append("no animation frame ran while the answer streamed")

            # 3. The API from the window's settings: serve, answer a real HTTP client, log it.
            api_port = free_port()
            app.tid("settings").click()
            app.set_field('[aria-label="API port"]', str(api_port))
            d.find_element(By.CSS_SELECTOR, '[aria-label="Keep API chats as conversations"]').click()
            app.tid("api-toggle").click()
            app.wait(lambda: "Serving at" in app.tid("api-status").text, 30, "the API did not start")
            address = app.fresh(lambda: app.tid("api-status").text).split("Serving at ", 1)[1].strip()
            body = json.dumps({
                "messages": [{"role": "user", "content": QUESTION}],
                "temperature": 0,
            }).encode()
            request = urllib.request.Request(
                f"{address}/chat/completions", data=body, headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=300) as r:
                reply = json.load(r)
            content = reply["choices"][0]["message"]["content"]
            print(f"API answer: {content!r}")
            if "Paris" not in content:
                failures.append(f"the API answer does not contain Paris: {content!r}")
            app.wait(lambda: "POST /v1/chat/completions" in app.tid("api-log").text, 30, "the request is not in the log")
            app.shot("app-api")
            # Kept as a conversation ("Keep API chats" is on): a client's tool call, its result
            # and the model's next call show as call cards in the window.
            tools_chat(app, d, address, failures)
            app.tid("settings").click()
            app.tid("api-toggle").click()
            app.wait(lambda: "Not serving" in app.tid("api-status").text, 30, "the API did not stop")
            d.find_element(By.CSS_SELECTOR, '[aria-label="Keep API chats as conversations"]').click()
            app.tid("api-toggle").click()
            app.wait(lambda: "Serving at" in app.tid("api-status").text, 30, "the API did not start again")
            app.find('[aria-label="Close the settings"]').click()

            # 4. A chat answered by a remote OpenAI-compatible server (here: this app's own
            #    API over HTTP), then by one that is not there: a clear error, kept.
            app.new_chat()
            app.tid("backend-remote").click()
            app.set_field('[data-testid="remote-url"]', address)
            app.set_field('[data-testid="remote-model"]', model.stem)
            app.set_field('[data-testid="remote-key"]', "sk-e2e-secret")  # the API takes any key: it has none
            app.tid("remote-use").click()
            app.wait(lambda: app.tid("remote-use").text == "In use", 30, "the remote backend was not taken")
            remote_chat = app.find('[data-testid="conversation-item"].active').get_attribute("data-id")
            with sqlite3.connect(db) as c:
                (settings,) = c.execute("SELECT settings FROM conversations WHERE id = ?", (int(remote_chat),)).fetchone()
            secrets = work / "config" / "secrets.json"
            mode = oct(secrets.stat().st_mode & 0o777) if secrets.exists() else None
            print(f"remote chat settings: {settings}; secrets file mode {mode}")
            if "sk-e2e-secret" in settings or "api_key" in settings:
                failures.append(f"the remote server's key is in the conversation's settings: {settings}")
            if mode != "0o600" or "sk-e2e-secret" not in secrets.read_text():
                failures.append(f"the key is not kept in a file only the user reads: {mode}")
            remote_id = app.ask(QUESTION)
            app.wait(lambda: app.status_of(remote_id) in ("done", "error"), 300, "the remote answer did not finish")
            remote_text = app.fresh(lambda: app.last_answer().text)
            with sqlite3.connect(db) as c:
                (status, content, model_used) = c.execute(
                    "SELECT status, content, model FROM messages WHERE id = ?", (int(remote_id),)
                ).fetchone()
            print(f"remote answer: {status} {content!r} from {model_used!r}")
            if status != "done" or "Paris" not in content or "@ http://" not in (model_used or ""):
                failures.append(f"the remote answer is wrong: {status} {content!r} {model_used!r}")
            if "Paris" not in remote_text:
                failures.append(f"the remote answer is not shown: {remote_text!r}")
            app.set_field('[data-testid="remote-url"]', "http://127.0.0.1:9")
            app.tid("remote-use").click()
            app.wait(lambda: app.tid("remote-use").text == "In use", 30)
            dead_id = app.ask("Are you there?")
            app.wait(lambda: app.status_of(dead_id) == "error", 120, "an unreachable server did not give an error")
            shown = app.fresh(lambda: app.find(f'[data-testid="message"][data-id="{dead_id}"]').text)
            print(f"unreachable server: {shown!r}")
            if "cannot reach" not in shown:
                failures.append(f"the unreachable server's error is not shown clearly: {shown!r}")
            app.shot("app-remote")

            # 5. The sampling, seen: the answer's tokens tinted with their candidates, the
            #    next-token distribution redrawn as temperature moves, and the activity view
            #    with two answers sharing the machine.
            app.new_chat()
            app.set_field('[aria-label="Temperature value"]', "1")
            app.set_field("#max-tokens-field", "60")
            probs_id = app.ask("Name three colours.")
            app.wait(lambda: app.status_of(probs_id) == "done", 300, "the answer did not finish")
            app.tid("show-probs").click()
            answer_el = app.find(f'[data-testid="message"][data-id="{probs_id}"]')
            token = app.tid("token", answer_el)
            token.click()
            popover = app.tid("popover")
            rows = popover.find_elements(By.CSS_SELECTOR, '[data-testid="candidate-row"]')
            sampled = [float(r.get_attribute("data-sampled")) for r in rows]
            drawn = popover.find_elements(By.CSS_SELECTOR, "tr.drawn")
            print(f"popover: {len(rows)} candidates, sampled sum {sum(sampled):.3f}, drawn marked: {len(drawn)}")
            if len(rows) < 8 or len(drawn) != 1 or sum(sampled) > 1.001:
                failures.append(f"the probability popover is wrong: {len(rows)} rows, {sampled}, {len(drawn)} drawn")
            app.shot("app-popover")
            with sqlite3.connect(db) as c:
                (kept, completion) = c.execute(
                    "SELECT t.tokens, m.completion_tokens FROM message_tokens t JOIN messages m ON m.id = t.message_id"
                    " WHERE t.message_id = ?", (int(probs_id),)
                ).fetchone()
            kept = json.loads(kept)
            print(f"token probabilities kept: {len(kept)} tokens for {completion} answer tokens")
            if len(kept) < completion:
                failures.append(f"not every token's probabilities were kept: {len(kept)} < {completion}")

            # Export with probabilities: the button, and the app's own save dialog (answered).
            exported = work / "answer.json"
            dialog_answer(exported)
            d.execute_script("arguments[0].click()", app.find('[aria-label="Export with probabilities"]', answer_el))
            app.wait(lambda: exported.exists(), 30, "the export with probabilities wrote nothing")
            time.sleep(0.5)  # written whole, then renamed into place: read after the rename
            doc = json.loads(exported.read_text())
            print(f"exported answer: {len(doc.get('tokens', []))} tokens, question {doc.get('question')!r}")
            if len(doc.get("tokens", [])) != len(kept) or doc.get("message", {}).get("id") != int(probs_id):
                failures.append(f"the answer's export with probabilities is wrong: {str(doc)[:300]}")
            elif "".join(t["text"] for t in doc["tokens"]) != doc["message"]["content"]:
                failures.append("the exported tokens do not add up to the answer")

            # A hostile page (model output is untrusted): a script calling the app's commands
            # with paths of its own writes and reads nothing; only what a dialog returned counts.
            evil = work / "evil"
            evil.mkdir()
            secret = evil / "secret.json"
            secret.write_text((work / "answer.json").read_text())
            call = lambda cmd, args: d.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "window.__TAURI_INTERNALS__.invoke(arguments[0], arguments[1])"
                ".then((r) => done({ok: r === undefined ? null : r}), (e) => done({err: JSON.stringify(e)}));",
                cmd, args,
            )
            conv_id = int(app.find('[data-testid="conversation-item"].active').get_attribute("data-id"))
            attempts = {
                "export_conversation": call("export_conversation", {"id": conv_id, "format": "json", "path": str(evil / "a.json")}),
                "export_answer": call("export_answer", {"message": int(probs_id), "path": str(evil / "b.json")}),
                "import_conversation": call("import_conversation", {"path": str(secret)}),
                "import_model": call("import_model", {"path": str(model)}),
                "select_model": call("select_model", {"path": str(secret)}),
                "plugin:dialog|save": call("plugin:dialog|save", {"options": {"defaultPath": str(evil / "c.json")}}),
                "plugin:opener|open_path": call("plugin:opener|open_path", {"path": str(secret)}),
                # A "draft model" of the page's own choosing is read no more than a model is.
                "set_params": call("set_params", {"conversation": conv_id, "settings": {
                    "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0,
                    "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0, "seed": None,
                    "max_tokens": None, "speed_up": "draft", "draft_model": str(secret)}}),
            }
            print(f"hostile page: {attempts}")
            written = sorted(p.name for p in evil.iterdir())
            if written != ["secret.json"]:
                failures.append(f"a page script wrote files of its own choosing: {written}")
            for cmd in ("export_conversation", "export_answer", "import_conversation", "import_model"):
                if attempts[cmd] != {"ok": None}:
                    failures.append(f"{cmd} with a path from the page did something: {attempts[cmd]}")
            for cmd in ("select_model", "plugin:dialog|save", "plugin:opener|open_path"):
                if "err" not in attempts[cmd]:
                    failures.append(f"{cmd} from the page was not refused: {attempts[cmd]}")
            if "not a model on this machine" not in attempts["set_params"].get("err", ""):
                failures.append(f"a draft model path from the page was not refused: {attempts['set_params']}")
            # Downloads name files, never paths (issue 40): an absolute and a `..` name are
            # refused before any network use, naming why.
            for spec in ("evil/repo:/etc/passwd.gguf", f"evil/repo:../../{evil.name}/x.gguf"):
                got = d.execute_async_script(
                    "const done = arguments[arguments.length - 1];"
                    "const ch = '__CHANNEL__:' + window.__TAURI_INTERNALS__.transformCallback(() => {});"
                    "window.__TAURI_INTERNALS__.invoke('download_model', {spec: arguments[0], onProgress: ch})"
                    ".then((r) => done({ok: r}), (e) => done({err: JSON.stringify(e)}));",
                    spec,
                )
                print(f"hostile download {spec!r}: {got}")
                if "not a file name in the repository" not in got.get("err", ""):
                    failures.append(f"a download naming a path was not refused: {spec!r} -> {got}")
            # What a dialog returns is honoured: export the conversation, import it back.
            chosen = work / "chosen.json"
            dialog_answer(chosen)
            d.find_element(By.CSS_SELECTOR, '[aria-label="Export as JSON"]').click()
            app.wait(lambda: chosen.exists(), 30, "exporting the conversation wrote nothing")
            time.sleep(0.5)
            before = len(d.find_elements(By.CSS_SELECTOR, '[data-testid="conversation-item"]'))
            dialog_answer(chosen)
            d.find_element(By.CSS_SELECTOR, '[aria-label="Import a conversation"]').click()
            app.wait(lambda: len(d.find_elements(By.CSS_SELECTOR, '[data-testid="conversation-item"]')) > before, 30,
                     "importing the exported conversation did nothing")
            # Back to the chat the probabilities were looked at in.
            app.fresh(lambda: app.find(f'[data-testid="conversation-item"][data-id="{conv_id}"] button.conv-open').click())
            app.find(f'[data-testid="message"][data-id="{probs_id}"]')

            chart = app.tid("preview-chart")
            top = lambda: float(app.find('[data-testid="preview-row"]', chart).get_attribute("data-sampled"))
            app.wait(lambda: top() < 0.999, 60, "the preview did not show temperature 1")
            warm = top()
            slider = app.tid("param-temperature")
            for _ in range(12):  # 1.0 → 0.4 in steps of 0.05
                slider.send_keys(Keys.ARROW_LEFT)
            app.wait(lambda: app.find('[aria-label="Temperature value"]').get_attribute("value") == "0.4", 30)
            app.wait(lambda: top() > warm, 30, "the preview did not sharpen at a lower temperature")
            time.sleep(1)  # the last redraw
            print(f"next-token preview: top token {warm:.3f} at temperature 1, {top():.3f} at 0.4")
            app.shot("app-distribution")

            app.set_field("#max-tokens-field", "4000")
            first_long = app.ask(LONG)
            app.new_chat()
            app.set_field("#max-tokens-field", "4000")
            second_long = app.ask("Write a long poem about the sea, the wind and the ships.")
            app.tid("activity").click()
            # The view redraws twice a second: read it (and click in it) in one step in the page,
            # so no element goes stale between finding and using it.
            live_states = lambda: d.execute_script(
                "return [...document.querySelectorAll('[data-testid=activity-row]')].map(r => r.dataset.state)"
            )
            app.wait(lambda: sum(s in ("decoding", "prefilling") for s in live_states()) == 2, 120, "two answers are not running")
            app.wait(lambda: len(d.find_elements(By.CSS_SELECTOR, '[data-testid="activity-row"] [data-testid="sparkline"]')) == 2, 30,
                     "no speed sparklines")
            print(f"activity: {live_states()}")
            app.shot("app-activity")
            for left in (1, 0):
                d.execute_script(
                    "document.querySelector('[data-testid=activity-row] .row-actions button:last-child').click()"
                )
                app.wait(lambda: len(live_states()) <= left, 60, "stopping from the activity view did not stop the answer")
            with sqlite3.connect(db) as c:
                ended = [c.execute("SELECT status FROM messages WHERE id = ?", (int(i),)).fetchone()[0] for i in (first_long, second_long)]
            print(f"stopped from the activity view: {ended}")
            if ended != ["stopped", "stopped"]:
                failures.append(f"answers stopped from the activity view are not kept as stopped: {ended}")
            d.find_element(By.CSS_SELECTOR, '[aria-label="Close the activity view"]').click()
            app.tid("settings").click()
            app.tid("api-toggle").click()
            app.wait(lambda: "Not serving" in app.tid("api-status").text, 30, "the API did not stop")
            try:
                urllib.request.urlopen(f"{address}/models", timeout=5)
                failures.append("the API still answers after it was turned off")
            except urllib.error.HTTPError as e:
                failures.append(f"the API still answers (HTTP {e.code}) after it was turned off")
            except urllib.error.URLError as e:
                if not isinstance(e.reason, ConnectionRefusedError):
                    failures.append(f"the API did not refuse the connection after it was turned off: {e.reason!r}")

            # 7. Other families in the real window: switch to the qwen3 and then the gemma3 test
            #    model in the manager, chat with each, and see the answer streamed and saved. The
            #    text is noise from random weights, but the right noise: `rill run`'s greedy
            #    answer to the same prompt on the same file (whose logits the families test ties
            #    to llama.cpp's).
            rill = app_binary.parent / "rill"
            app.find('[aria-label="Close the settings"]').click()
            # (6b. Speed up first: lookup, then a draft model, with the draft tokens taken shown
            #  under each answer and saved with it; tests/e2e_speed.py.)
            speed_up(app, d, db, failures)
            # Tokens per answer: enough for each to span many frames. The gemma3 test model writes
            # 12 tokens in about 10 ms, inside one frame, and the window rightly shows such an
            # answer done at once; 1,000 of its tokens take most of a second.
            for path, family, tokens in zip(family_models, ("Qwen3", "Gemma 3"), ("12", "1000")):
                app.tid("model-picker").click()
                rows = app.wait(lambda: [r for r in d.find_elements(By.CSS_SELECTOR, ".model-list li") if str(path) in r.text], 30,
                                f"{path.name} is not in the manager")
                print(f"manager row: {rows[0].text!r}")
                if family not in rows[0].text:
                    failures.append(f"the manager does not name {path.name}'s family {family}: {rows[0].text!r}")
                rows[0].find_element(By.CSS_SELECTOR, "button").click()
                stem = path.name.split("-test")[0]
                app.wait(lambda: stem in app.tid("model-picker").text.lower(), 120, f"{path.name} did not load")
                if d.find_elements(By.CSS_SELECTOR, '[aria-label="Close the model manager"]'):
                    d.find_element(By.CSS_SELECTOR, '[aria-label="Close the model manager"]').click()
                app.new_chat()
                app.set_field('[aria-label="Temperature value"]', "0")
                app.set_field("#max-tokens-field", tokens)
                answer = app.ask("Hello")
                app.wait(lambda: app.status_of(answer) in ("done", "stopped"), 300, f"the {family} answer did not finish")
                streamed = f"{answer}:streaming" in d.execute_script("return window.__seen")
                with sqlite3.connect(db) as c:
                    (stored, status) = c.execute("SELECT content, status FROM messages WHERE id = ?", (int(answer),)).fetchone()
                cli = subprocess.run(
                    [str(rill), "run", "--model", str(path), "--temperature", "0", "--max-tokens", tokens, "--prompt", "Hello"],
                    capture_output=True, text=True, timeout=300, env=env,
                )
                expected = cli.stdout.rstrip("\n")
                print(f"{family}: window {stored[:80]!r}… ({len(stored)} chars, {status}, seen streaming: {streamed});"
                      f" rill run {expected[:80]!r}… ({len(expected)} chars)")
                app.shot(f"app-{stem}")
                if cli.returncode != 0:
                    failures.append(f"rill run failed on {path.name}: {cli.stderr[-500:]}")
                if not streamed:
                    failures.append(f"the {family} answer was never shown streaming")
                if status != "done" or not stored:
                    failures.append(f"the {family} answer is not saved as a finished answer: {status} {stored!r}")
                if stored != expected:
                    failures.append(f"the {family} answer in the window is not rill run's greedy answer: {stored!r} vs {expected!r}")

            # 8. A thinking model: the qwen2 test model under the DeepSeek-R1 template, which
            #    opens the block when the Think switch is on (so the random model thinks until
            #    the budget closes it). The
            #    Thinking block streams open with its count, then folds to "Thought for …" as
            #    the answer starts; the reasoning is saved beside the answer.
            think_thinking(app, d, thinking_model, db, failures, "deepseek-r1-qwen")
            # 9. gpt-oss: its analysis channel is the reasoning, in the same Thinking block, its
            #    final channel the answer (the budget ends the analysis of the random model).
            think_thinking(app, d, harmony_model, db, failures, "gpt-oss")
            # 10. A picture dropped into a chat (tests/e2e_images.py).
            image_chat = images_chat(app, d, seeing_model, db, work, rill, env, dialog_answer, failures)
        except Exception:
            app.shot("app-failure")
            print("page text at failure:", d.find_element(By.TAG_NAME, "body").text[:2000])
            print((work / "tauri-driver.log").read_text()[-4000:])
            raise
        finally:
            d.quit()
        # 11. The app again, on the same SQLite file: the picture is still there.
        if image_chat:
            d = webdriver.Remote(command_executor=f"http://127.0.0.1:{port}", options=options)
            try:
                after_restart(App(d), d, image_chat, failures)
            finally:
                d.quit()
    finally:
        tauri_driver.terminate()
        tauri_driver.wait(10)
        log.close()
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        print((work / "tauri-driver.log").read_text()[-4000:])
        return 1
    shutil.rmtree(work, ignore_errors=True)
    print("end-to-end app test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
