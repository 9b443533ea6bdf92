"""Pictures in the real window (issue 42), on the Gemma 3 test model with its test projector
beside it: llama.cpp's test photo dropped on the composer, the question's answer streamed and
equal to `rill run --image`'s greedy answer on the same files, the picture shown in the message
(larger on click) and saved once in the SQLite file, exported to JSON and imported back (still
stored once), and shown again after the app restarts (`after_restart`)."""

import base64
import hashlib
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from e2e_lib import App

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is in this picture?"
TOKENS = "24"
PHOTO_WIDTH = 640  # test-1.jpeg is 640 × 488


def photo() -> Path:
    src = subprocess.run(["bash", str(ROOT / "scripts/llama-cpp-source.sh")], capture_output=True,
                         text=True, check=True).stdout.strip()
    return Path(src) / "tools/mtmd/test-1.jpeg"


def vision_model(models: Path) -> Path:
    """The test model in a folder of its own, its projector beside it as LM Studio keeps them."""
    folder = models / "vision"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "models/test-models/gemma3v-test.Q8_0.gguf", folder / "gemma3v-test.Q8_0.gguf")
    shutil.copy(ROOT / "models/test-models/gemma3-mmproj-test.F16.gguf", folder / "mmproj-gemma3v-test-F16.gguf")
    return folder / "gemma3v-test.Q8_0.gguf"


def drop(d: webdriver.Remote, path: Path) -> None:
    """Drops the file on the composer as a file manager would: a drop event carrying it."""
    d.execute_script(
        "const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));"
        "const dt = new DataTransfer();"
        "dt.items.add(new File([bytes], arguments[1], {type: 'image/jpeg'}));"
        "const box = document.querySelector('[data-testid=composer-box]');"
        "box.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));"
        "box.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));",
        base64.b64encode(path.read_bytes()).decode(), path.name)


def shown_image(app: App, d: webdriver.Remote, message_id: str) -> int:
    """The natural width of the picture shown in message `message_id` (0 until it loads)."""
    return app.fresh(lambda: d.execute_script(
        "const m = document.querySelector(`[data-testid=message][data-id='${arguments[0]}']`);"
        "const img = m && m.querySelector('[data-testid=message-image]');"
        "return img && img.complete ? img.naturalWidth : 0;", message_id))


def images_chat(app: App, d: webdriver.Remote, model: Path, db: Path, work: Path, rill: Path,
                env: dict, dialog_answer, failures: list) -> str | None:
    """Step 10; the id of the chat with the picture, for `after_restart`."""
    picture = photo()
    digest = hashlib.sha256(picture.read_bytes()).hexdigest()
    app.tid("model-picker").click()
    rows = app.wait(lambda: [r for r in d.find_elements(By.CSS_SELECTOR, ".model-list li") if str(model) in r.text], 30,
                    f"{model.name} is not in the manager")
    print(f"manager row: {rows[0].text!r}")
    if not rows[0].find_elements(By.CSS_SELECTOR, '[data-testid="vision-badge"]'):
        failures.append(f"the manager does not say {model.name} reads images: {rows[0].text!r}")
    listed = [r.text for r in d.find_elements(By.CSS_SELECTOR, ".model-list li") if "mmproj" in r.text.split("\n")[0]]
    if listed:
        failures.append(f"the manager lists a projector as a model: {listed}")
    rows[0].find_element(By.CSS_SELECTOR, "button").click()
    app.wait(lambda: "gemma3v" in app.tid("model-picker").text.lower(), 120, f"{model.name} did not load")
    if d.find_elements(By.CSS_SELECTOR, '[aria-label="Close the model manager"]'):
        d.find_element(By.CSS_SELECTOR, '[aria-label="Close the model manager"]').click()
    app.new_chat()
    app.set_field('[aria-label="Temperature value"]', "0")
    app.set_field("#max-tokens-field", TOKENS)

    drop(d, picture)
    app.wait(lambda: d.find_elements(By.CSS_SELECTOR, '[data-testid="attachment"]'), 30, "the dropped picture is not in the composer")
    answer = app.ask(QUESTION)
    app.wait(lambda: app.status_of(answer) == "done", 300, "the answer about the picture did not finish")
    streamed = f"{answer}:streaming" in d.execute_script("return window.__seen")
    user = app.fresh(lambda: d.execute_script(
        "const a = document.querySelector(`[data-testid=message][data-id='${arguments[0]}']`);"
        "const all = [...document.querySelectorAll('[data-testid=message]')];"
        "return all[all.indexOf(a) - 1].dataset.id;", answer))
    width = app.wait(lambda: shown_image(app, d, user), 30, "the picture is not shown in the question")
    app.shot("app-image")
    with sqlite3.connect(db) as c:
        (stored, status, conv) = c.execute(
            "SELECT content, status, conversation_id FROM messages WHERE id = ?", (int(answer),)).fetchone()
        linked = c.execute("SELECT image_hash FROM message_images WHERE message_id = ?", (int(user),)).fetchall()
        saved = c.execute("SELECT length(bytes) FROM images WHERE hash = ?", (digest,)).fetchone()
    cli = subprocess.run(
        [str(rill), "run", "--model", str(model), "--image", str(picture), "--temperature", "0",
         "--max-tokens", TOKENS, "--prompt", QUESTION],
        capture_output=True, text=True, timeout=300, env=env)
    expected = cli.stdout.rstrip("\n")
    print(f"image chat: window {stored!r} ({status}, streamed: {streamed}); rill run {expected!r};"
          f" shown {width}px wide; saved {saved}, linked {linked}")
    if cli.returncode != 0:
        failures.append(f"rill run --image failed: {cli.stderr[-500:]}")
    if not streamed:
        failures.append("the answer about the picture was never shown streaming")
    if status != "done" or not stored or stored != expected:
        failures.append(f"the window's answer about the picture is not rill run's: {stored!r} vs {expected!r}")
    if linked != [(digest,)] or saved != (picture.stat().st_size,):
        failures.append(f"the picture is not saved whole in SQLite: linked {linked}, saved {saved}")
    if width != PHOTO_WIDTH:
        failures.append(f"the shown picture is {width}px wide, not the photo's {PHOTO_WIDTH}")

    # Larger on click, closed by Esc.
    thumb = app.find(f'[data-testid="message"][data-id="{user}"] [data-testid="message-image"]')
    d.execute_script("arguments[0].click()", thumb)
    app.tid("lightbox")
    d.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    app.wait(lambda: not d.find_elements(By.CSS_SELECTOR, '[data-testid="lightbox"]'), 10, "Esc did not close the picture")

    # Exported to JSON (the picture inside) and imported back: a new chat, the same picture.
    exported = work / "image-chat.json"
    dialog_answer(exported)
    app.find('[aria-label="Export as JSON"]').click()
    app.wait(lambda: exported.exists() and exported.stat().st_size > 0, 30, "exporting the picture's chat wrote nothing")
    doc = json.loads(exported.read_text())
    if digest not in json.dumps(doc.get("images", doc)):
        failures.append("the JSON export does not hold the picture")
    dialog_answer(exported)
    before = len(d.find_elements(By.CSS_SELECTOR, '[data-testid="conversation-item"]'))
    d.find_element(By.CSS_SELECTOR, '[aria-label="Import a conversation"]').click()
    app.wait(lambda: len(d.find_elements(By.CSS_SELECTOR, '[data-testid="conversation-item"]')) > before, 30,
             "importing the picture's chat did nothing")
    with sqlite3.connect(db) as c:
        links = c.execute("SELECT count(*) FROM message_images WHERE image_hash = ?", (digest,)).fetchone()[0]
        copies = c.execute("SELECT count(*) FROM images WHERE hash = ?", (digest,)).fetchone()[0]
    print(f"after import: {links} messages show the picture, stored {copies} time(s)")
    if (links, copies) != (2, 1):
        failures.append(f"the imported chat's picture: {links} links, {copies} stored copies (want 2, 1)")
    return str(conv)


def after_restart(app: App, d: webdriver.Remote, conv: str, failures: list) -> None:
    """The app started again on the same SQLite file shows the picture in its chat."""
    item = f'[data-testid="conversation-item"][data-id="{conv}"] button.conv-open'
    app.fresh(lambda: app.find(item).click())
    user = app.wait(lambda: d.execute_script(
        "const m = document.querySelector('[data-testid=message][data-role=user]');"
        "return m ? m.dataset.id : null;"), 30, "the picture's chat did not open after the restart")
    width = app.wait(lambda: shown_image(app, d, user), 30, "the picture is not shown after the restart")
    print(f"after restart: the picture is shown {width}px wide")
    if width != PHOTO_WIDTH:
        failures.append(f"after the restart the picture is {width}px wide, not {PHOTO_WIDTH}")
