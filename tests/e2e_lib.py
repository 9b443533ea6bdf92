"""What the window's end-to-end tests share: tauri-driver's port, and `App`, a few verbs over
selenium for the real Tauri window (find by test id, wait while views redraw, ask in the open
chat, stop an answer, take a screenshot)."""

import socket
import subprocess
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

SHOTS = Path(__file__).resolve().parent / "screenshots"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"tauri-driver exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("tauri-driver did not start")


# The views redraw as data arrives over IPC: an element found a moment ago may be replaced
# before it is read. A wait tries again then, as it does when the element is not there yet.
RETRY = (NoSuchElementException, StaleElementReferenceException)


class App:
    def __init__(self, driver: webdriver.Remote):
        self.d = driver

    def find(self, selector: str, scope=None, timeout: float = 30):
        """The element once it is there: views render after their data arrives over IPC."""
        where = scope or self.d
        return WebDriverWait(self.d, timeout, poll_frequency=0.1, ignored_exceptions=RETRY).until(
            lambda _: where.find_element(By.CSS_SELECTOR, selector), f"no {selector} on the page"
        )

    def tid(self, name: str, scope=None):
        return self.find(f'[data-testid="{name}"]', scope)

    def wait(self, what, timeout: float = 300, message: str = ""):
        return WebDriverWait(self.d, timeout, poll_frequency=0.2, ignored_exceptions=RETRY).until(
            lambda _: what(), message
        )

    def fresh(self, read):
        """`read()`, again if the view redrew an element it held (a few times, as `wait` would)."""
        for _ in range(50):
            try:
                return read()
            except StaleElementReferenceException:
                time.sleep(0.1)
        return read()

    def answers(self):
        return self.d.find_elements(By.CSS_SELECTOR, '[data-testid="message"][data-role="assistant"]')

    def last_answer(self):
        found = self.answers()
        return found[-1] if found else None

    def set_field(self, selector: str, value: str) -> None:
        field = self.find(selector)
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(Keys.BACKSPACE)
        if value:
            field.send_keys(value)

    def new_chat(self) -> None:
        before = len(self.d.find_elements(By.CSS_SELECTOR, '[data-testid="conversation-item"]'))
        self.tid("new-chat").click()
        self.wait(lambda: len(self.d.find_elements(By.CSS_SELECTOR, '[data-testid="conversation-item"]')) > before, 30)
        self.wait(lambda: self.tid("composer").is_displayed(), 30)

    def ask(self, text: str) -> str:
        """Sends `text` in the open chat; returns the id of the answer's message element."""
        count = len(self.answers())
        composer = self.tid("composer")
        composer.send_keys(text)
        composer.send_keys(Keys.ENTER)
        self.wait(lambda: len(self.answers()) > count, 60, "no answer appeared")
        return self.fresh(lambda: self.last_answer().get_attribute("data-id"))

    def status_of(self, answer_id: str) -> str | None:
        # The answer may be in a chat that is not open now: ask the sidebar/live state via DOM.
        def read():
            found = self.d.find_elements(By.CSS_SELECTOR, f'[data-testid="message"][data-id="{answer_id}"]')
            return found[0].get_attribute("data-status") if found else None

        return self.fresh(read)

    def stop(self, answer_id: str) -> None:
        """Clicks a streaming answer's Stop and waits until it is stopped. A click in the page,
        not at coordinates: the answer streams fast enough that the button moves between
        WebDriver measuring it and clicking."""
        stop = self.tid("stop", self.find(f'[data-testid="message"][data-id="{answer_id}"]'))
        self.d.execute_script("arguments[0].click()", stop)
        self.wait(lambda: self.status_of(answer_id) == "stopped", 60, "stop did not stop")

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.d.save_screenshot(str(SHOTS / f"{name}.png"))
