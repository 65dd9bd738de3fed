"""Render a web page in a real headless browser and read what a user would see.

A page like the worker's status page (``engine/worker/ui/index.html``) is mostly JavaScript: the HTML the
server sends has an empty table, and the rows only exist after the page has fetched the REST API and built
them. An HTTP test proves the server answers; only a browser proves that the page's script runs, calls the
right URLs, sends the token and renders the answers, so the page is tested in Debian's headless chromium
(installed by ``.ci/chromium.sh``).

- ``render_page(url)``: the DOM after the page's scripts ran (``chromium --headless --dump-dom``);
- ``visible_text(dom)``: that DOM's text with tags, scripts, styles and ``hidden`` elements left out;
- ``browser_page()``: a page to click in, answer dialogs in and screenshot (Playwright driving the same
  chromium binary: ``--dump-dom`` cannot click). Playwright is a ``dev`` dependency; its own browser
  downloads are never used (``playwright install`` is not needed).

``--virtual-time-budget`` makes the wait deterministic: chromium runs the page on a virtual clock that only
advances while no network fetch is pending, and dumps the DOM once ``wait_ms`` of virtual time has passed,
so timers (a 2 s refresh loop) fire as if that much time had passed, fetches in flight are waited for, and
the call returns as soon as the work is done rather than after a wall-clock sleep (a 4 s budget of a page
polling every 2 s takes about one real second). Without the flag ``--dump-dom`` dumps at the load event, when
the first fetch may or may not have been answered yet; with ``--virtual-time-budget=0`` chromium never dumps.
A request that is never answered stalls virtual time, so ``timeout_s`` (real time) is what bounds the call.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL_HINT = "install it with `apt-get install chromium` (or run .ci/chromium.sh)"

# Elements whose content is never shown as text, and void elements (they have no end tag in the dumped DOM).
_SKIPPED = frozenset({"script", "style", "template", "noscript", "head"})
_VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
                   "track", "wbr"})
# Inline elements do not separate words; every other element boundary counts as whitespace.
_INLINE = frozenset({"a", "abbr", "b", "bdi", "bdo", "cite", "code", "data", "dfn", "em", "i", "kbd", "label",
                     "mark", "q", "s", "samp", "small", "span", "strong", "sub", "sup", "time", "u", "var"})


class BrowserError(RuntimeError):
    """The headless browser could not render the page; the message names the binary or the URL."""


class BrowserMissing(BrowserError):
    """No chromium binary on PATH: the message names the binaries looked for and how to install one."""


class BrowserTimeout(BrowserError):
    """chromium did not finish rendering in time; its process group was killed."""


class BrowserFailed(BrowserError):
    """chromium exited with an error or dumped no DOM; the message carries the end of its stderr."""


def find_browser() -> str:
    """The path of the first of ``BROWSER_NAMES`` found on PATH."""
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path is not None:
            return path
    raise BrowserMissing(f"no headless browser found: looked for {', '.join(BROWSER_NAMES)} on PATH; {INSTALL_HINT}")


def render_page(url: str, *, timeout_s: float = 30.0, wait_ms: int = 4000) -> str:
    """The DOM of ``url`` serialised after ``wait_ms`` of the page's (virtual) time.

    chromium runs in its own session with a throwaway profile directory, removed afterwards; if it is not done
    within ``timeout_s`` seconds of real time its whole process group is killed and ``BrowserTimeout`` raised.
    """
    if wait_ms < 1:
        raise ValueError(f"wait_ms must be at least 1, not {wait_ms}: chromium never dumps with a budget of 0")
    binary = find_browser()
    with tempfile.TemporaryDirectory(prefix="epochline-browser-", ignore_cleanup_errors=True) as scratch:
        work = Path(scratch)
        profile = work / "profile"
        profile.mkdir()
        command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   f"--user-data-dir={profile}", f"--virtual-time-budget={wait_ms}", "--dump-dom", url]
        # Output goes to files, not pipes: helpers chromium leaves behind would keep a pipe open past its exit.
        with open(work / "stdout", "wb") as stdout, open(work / "stderr", "wb") as stderr:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                                       start_new_session=True)
            try:
                returncode = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise BrowserTimeout(f"{binary} did not render {url} within {timeout_s:g} s; killed it") from None
            finally:
                _kill_group(process)
        dom = (work / "stdout").read_text(errors="replace")
        errors = (work / "stderr").read_text(errors="replace")
    if returncode != 0 or not dom.strip():
        tail = "\n".join(errors.splitlines()[-20:])
        raise BrowserFailed(f"{binary} exited with {returncode} rendering {url} and dumped "
                            f"{len(dom)} characters of DOM; its stderr ends:\n{tail}")
    return dom


@contextlib.contextmanager
def browser_page(*, timeout_s: float = 20.0, width: int = 1400, height: int = 900) -> Iterator[Page]:
    """A fresh page of headless chromium (``find_browser``'s binary) driven by Playwright; every wait and
    action on it gives up after ``timeout_s``. The browser is closed on leaving, whatever happened."""
    from playwright.sync_api import sync_playwright  # a dev dependency: only the tests that click need it

    binary = find_browser()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=binary, args=["--no-sandbox", "--disable-gpu",
                                                                           "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_s * 1000)
            yield page
        finally:
            browser.close()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the session ``process`` leads (chromium's helper processes) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def visible_text(dom: str) -> str:
    """The text of ``dom`` with tags stripped and whitespace collapsed to single spaces.

    Left out: ``<script>``, ``<style>``, ``<template>``, ``<noscript>``, ``<head>`` and every element with the
    ``hidden`` attribute (the page's way of hiding a banner or form). Entities are decoded, so text the page
    set with ``textContent = "<b>x</b>"`` reads back as ``<b>x</b>``. Text inside a closed ``<details>`` counts:
    it is one click away. CSS is not evaluated.
    """
    parser = _TextParser()
    parser.feed(dom)
    parser.close()
    return re.sub(r"\s+", " ", "".join(parser.parts)).strip()


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._open: list[tuple[str, bool]] = []  # (tag, content skipped) of each element not yet closed

    @property
    def _skipping(self) -> bool:
        return bool(self._open) and self._open[-1][1]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _INLINE:
            self.parts.append(" ")
        if tag in _VOID:
            return
        hidden = tag in _SKIPPED or any(name == "hidden" for name, _ in attrs)
        self._open.append((tag, self._skipping or hidden))

    def handle_endtag(self, tag: str) -> None:
        if tag not in _INLINE:
            self.parts.append(" ")
        if not any(open_tag == tag for open_tag, _ in self._open):
            return  # a stray end tag (dumped DOMs have none, hand-written HTML may)
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)
