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


def tinted(app: App, answer: str, db: Path, failures: list) -> None:
    """The answer shows its drafted tokens tinted: some, not all, and the text is the saved one."""
    node = lambda: app.find(f'[data-testid="message"][data-id="{answer}"]')
    marks = app.fresh(lambda: [m.text for m in app.tid("drafted-text", node())
                               .find_elements("css selector", "mark.drafted")])
    text = app.fresh(lambda: app.tid("drafted-text", node()).text)
    with sqlite3.connect(db) as c:
        (saved,) = c.execute("SELECT content FROM messages WHERE id = ?", (int(answer),)).fetchone()
    print(f"tinted: {len(marks)} drafted spans, {sum(map(len, marks))} of {len(text)} characters")
    if not marks or sum(map(len, marks)) >= len(text):
        failures.append(f"the tint marks {len(marks)} spans of a copying answer: {marks!r}")
    if text.split() != saved.split():
        failures.append(f"the tinted text is not the saved answer: {text!r} / {saved!r}")


def speed_up(app: App, d: webdriver.Remote, db: Path, failures: list) -> None:
    app.new_chat()
    app.set_field('[aria-label="Temperature value"]', "0")
    app.set_field("#max-tokens-field", "60")
    Select(app.tid("param-speed-up")).select_by_value("lookup")
    # The Drafts switch (off by default) tints the tokens a draft proposed and the model drew.
    tint = app.tid("tint-drafts")
    if tint.is_selected():
        failures.append("the Drafts tint is on by default")
    tint.click()
    answer = app.ask(f"Repeat this text exactly: {PASSAGE}")
    draft_stats(app, answer, db, failures, "lookup")
    tinted(app, answer, db, failures)
    app.tid("tint-drafts").click()

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
