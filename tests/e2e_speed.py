"""The window's "Speed up" (issue 17), in the real Tauri window on the real SmolLM2 model:
lookup, then a draft model chosen from the models list (a copy of SmolLM2, drafting for
itself), each answering a copy-heavy question with the draft tokens it took shown under the
answer and saved with it."""

import re
import sqlite3
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.support.ui import Select

from e2e_lib import App

PASSAGE = ("The river carried grain from the hills to the city every spring. The boats were long "
           "and flat, and the boatmen sang as they poled them past the mills.")


def draft_stats(app: App, answer: str, db: Path, failures: list, how: str) -> None:
    """The counts under `answer` ("drafts A/P accepted") equal the saved ones, and are real."""
    app.wait(lambda: app.status_of(answer) == "done", 300, f"the {how} answer did not finish")
    node = lambda: app.find(f'[data-testid="message"][data-id="{answer}"]')
    shown = app.fresh(lambda: app.tid("draft-stats", node()).text)
    with sqlite3.connect(db) as c:
        saved = c.execute("SELECT draft_accepted, draft_proposed FROM messages WHERE id = ?",
                          (int(answer),)).fetchone()
    print(f"{how}: under the answer {shown!r}; saved {saved}")
    m = re.search(r"drafts (\d+)/(\d+) accepted", shown)
    if not m or (int(m[1]), int(m[2])) != saved:
        failures.append(f"{how}: the counts under the answer ({shown!r}) are not the saved ones {saved}")
    elif not 0 < saved[0] <= saved[1]:
        failures.append(f"{how}: no draft token was taken on a copying answer: {saved}")


def speed_up(app: App, d: webdriver.Remote, db: Path, failures: list) -> None:
    app.new_chat()
    app.set_field('[aria-label="Temperature value"]', "0")
    app.set_field("#max-tokens-field", "60")
    Select(app.tid("param-speed-up")).select_by_value("lookup")
    answer = app.ask(f"Repeat this text exactly: {PASSAGE}")
    draft_stats(app, answer, db, failures, "lookup")

    # A draft model: the manager's models of the loaded one's family, smallest first; choosing
    # one loads it as the engine's draft.
    Select(app.tid("param-speed-up")).select_by_value("draft")
    picked = app.wait(lambda: Select(app.tid("param-draft-model")).first_selected_option.get_attribute("value"),
                      30, "no draft model was suggested")
    print(f"draft model suggested: {picked}")
    if not picked.endswith("SmolLM2-135M-Instruct.Q4_1.gguf"):
        failures.append(f"the suggested draft model is not the family's: {picked}")
    answer = app.ask(f"Repeat this text exactly: {PASSAGE}")
    draft_stats(app, answer, db, failures, "draft model")
    app.shot("app-speed-up")
    speed = app.tid("param-speed-up")
    d.execute_script("arguments[0].scrollIntoView()", speed)
    Select(speed).select_by_value("off")
