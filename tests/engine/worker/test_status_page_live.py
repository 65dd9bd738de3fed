"""The status page (``/ui``) as an operator uses it: headless chromium, driven by Playwright, against a real
``epochline worker`` process over the real broker.

One worker serves three connectors: one running with dead letters, one paused, one failed (its Python
transform raises while a flag file exists). The page shows each in its state; a connector's details show its
partitions' lag, its throughput and lag over the last minutes as inline SVG, its config with secrets
redacted and its last committed dead letters with their reasons; its buttons, once confirmed, pause, resume,
restart and delete it through the REST API and its request guard, and do nothing when the confirmation is
cancelled. A worker with a token serves the page too: the page asks for the token and then works.

Screenshots of the page go to the test's directory and to ``EPOCHLINE_SCREENSHOTS`` (default
``/tmp/epochline-screenshots``), so they can be attached to a review.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from playwright.sync_api import Locator, Page, expect

from connectors.admin import create_topic
from engine.testing import LocalWorker
from engine.testing.accounting import read_dead_letters
from engine.testing.browser import browser_page
from engine.testing.connectors import LiveInput, produce_values
from engine.worker.client import WorkerApiError
from tests.helpers.transforms import FAIL_FLAG_ENV
from tests.helpers.worker_process import start_worker, wait_for

PARTITIONS = 2
GOOD, BAD = 40, 6
STREAMED = 3_000
"""Good records written while the details are open, so the throughput line has something to show."""
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
SECRET = "hunter2-do-not-show"
MARKUP = b'<img src=x onerror="document.title=1">'
"""A bad record whose bytes are markup: the page shows dead letters' values as text, never as HTML."""
SCREENSHOTS = Path(os.environ.get("EPOCHLINE_SCREENSHOTS", "/tmp/epochline-screenshots"))


@dataclass
class Deployment:
    worker: LocalWorker
    bootstrap: str
    prefix: str
    artefacts: Path

    def dead_letter_topic(self, name: str) -> str:
        return f"{self.prefix}-{name}-dlq"


def config(prefix: str, name: str, **extra: Any) -> dict[str, Any]:
    """A connector of its own topics, whose producer settings hold a secret the page must not show."""
    return {"source": {"topic": f"{prefix}-{name}-in", "format": "json", "schema": SCHEMA},
            "transform": {"sql": "SELECT id FROM input"},
            "sink": {"topic": f"{prefix}-{name}-out", "producer": {"ssl.key.password": SECRET}},
            "dead_letter": {"topic": f"{prefix}-{name}-dlq"}, **extra}


def input_of(bootstrap: str, prefix: str, name: str) -> str:
    for suffix in ("in", "out", "dlq"):
        create_topic(bootstrap, f"{prefix}-{name}-{suffix}", partitions=PARTITIONS)
    return f"{prefix}-{name}-in"


def status(worker: LocalWorker, name: str) -> dict[str, Any]:
    with worker.client() as client:
        answer: dict[str, Any] = client.status(name)
        return answer


def task_is(worker: LocalWorker, name: str, wanted: str) -> dict[str, Any] | None:
    """The connector's one task when its state is ``wanted`` (the connector's state follows its target at
    once; its task's, only once the task process stopped or started)."""
    tasks = status(worker, name)["tasks"]
    return tasks[0] if len(tasks) == 1 and tasks[0]["state"] == wanted and tasks[0] else None


def state(worker: LocalWorker, name: str) -> str | None:
    try:
        return str(status(worker, name)["connector"]["state"])
    except WorkerApiError as error:
        if error.status_code == 404:
            return None
        raise


@pytest.fixture(scope="module")
def deployment(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """A worker running ``live`` (40 good records, 6 bad ones dead-lettered, one of them markup), ``idle``
    (paused) and ``broken`` (FAILED: its transform raises and the worker gives up after one failure)."""
    directory = tmp_path_factory.mktemp("status-page")
    prefix = f"ui-{uuid.uuid4().hex[:8]}"
    flag = directory / "fail-flag"
    flag.touch()
    worker = start_worker(directory, kafka_bootstrap, prefix, "w1", extra_args=("--max-task-failures", "1"),
                          env={FAIL_FLAG_ENV: str(flag)})
    try:
        live = input_of(kafka_bootstrap, prefix, "live")
        rows = [orjson.dumps({"id": i}) for i in range(GOOD)] + [b"{not json %d" % i for i in range(BAD - 1)]
        rows.append(MARKUP)
        produce_values(kafka_bootstrap, live, rows, PARTITIONS)
        produce_values(kafka_bootstrap, input_of(kafka_bootstrap, prefix, "broken"), [b'{"id": 1}'], PARTITIONS)
        input_of(kafka_bootstrap, prefix, "idle")
        broken = config(prefix, "broken", transform={"python": "tests.helpers.transforms:fail_while_flagged"})
        with worker.client() as client:
            client.create("live", config(prefix, "live"))
            client.create("idle", config(prefix, "idle"))
            client.pause("idle")
            client.create("broken", broken)
        wait_for("live's dead letters committed", lambda: status(worker, "live")["dead_letters"] == BAD, 90)
        wait_for("idle paused", lambda: state(worker, "idle") == "PAUSED", 60)
        wait_for("broken failed", lambda: state(worker, "broken") == "FAILED", 90)
        yield Deployment(worker, kafka_bootstrap, prefix, directory / "screenshots")
    finally:
        worker.kill()


def screenshot(page: Page, deployment: Deployment, name: str) -> Path:
    """The whole page as PNG in the test's artefacts, copied to ``SCREENSHOTS``."""
    deployment.artefacts.mkdir(parents=True, exist_ok=True)
    path = deployment.artefacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, SCREENSHOTS / path.name)
    return path


def row(page: Page, name: str) -> Any:
    return page.locator(f'tr[data-connector="{name}"]')


def click_confirmed(page: Page, name: str, action: str, *, accept: bool = True) -> str:
    """Click ``action`` of connector ``name`` and answer its confirmation; the question asked."""
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept() if accept else dialog.dismiss()

    page.once("dialog", answer)
    row(page, name).locator(f'button[data-action="{action}"]').click()
    wait_for(f"the {action} confirmation", lambda: asked, 10, every_s=0.1)
    return asked[0]


def assert_partitions_shown_as_status(worker: LocalWorker, lag_rows: Locator, topic: str,
                                      timeout_s: float = 15.0) -> None:
    """The page's partition rows say what REST status says. The page refreshes every 2 s and the committed
    offsets may still move, so the two are compared until they agree (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        by_partition = {p["partition"]: p for p in status(worker, "live")["partitions"]}
        rows = [lag_rows.nth(index).locator("td").all_inner_texts() for index in range(PARTITIONS)]
        shown = {int(cells[1]): [cells[0], int(cells[2]), int(cells[3]), int(cells[4])] for cells in rows}
        expected = {partition: [topic, p["committed"], p["end"], p["lag"]] for partition, p in by_partition.items()}
        if shown == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert shown == expected


def test_the_page_shows_a_running_a_paused_and_a_failed_connector_and_a_connectors_details(
        deployment: Deployment) -> None:
    worker = deployment.worker
    with browser_page() as page:
        page.goto(f"{worker.url}/ui")
        for name, expected in (("live", "RUNNING"), ("idle", "PAUSED"), ("broken", "FAILED")):
            expect(row(page, name).locator("td.state")).to_have_text(expected)
        expect(row(page, "live").locator("td.dead-letters")).to_have_text(str(BAD))
        expect(row(page, "broken")).to_contain_text("failing on purpose")
        screenshot(page, deployment, "status-running-paused-failed")

        row(page, "live").locator("button.toggle").click()
        details = page.locator('tr[data-details-of="live"]')
        lag_rows = details.locator(".partitions-panel tbody tr")
        expect(lag_rows).to_have_count(PARTITIONS)
        assert_partitions_shown_as_status(worker, lag_rows, f"{deployment.prefix}-live-in")
        # the partitions are compared while no input moves; then more streams in for the history
        streaming = LiveInput(deployment.bootstrap, f"{deployment.prefix}-live-in",
                              [orjson.dumps({"id": i}) for i in range(GOOD, GOOD + STREAMED)], PARTITIONS, seconds=15)
        reasons = details.locator(".dead-letters-panel tbody tr")
        expect(reasons).to_have_count(BAD)
        assert all("decode" in text for text in reasons.all_inner_texts())
        expect(details.locator(".dead-letters-panel")).to_contain_text(MARKUP.decode())
        assert details.locator(".dead-letters-panel img").count() == 0
        config = details.locator("pre.config").inner_text()
        assert "ssl.key.password" in config and "[redacted]" in config and SECRET not in page.content()
        # the history is sampled every 5 s: the records streaming in draw a line of throughput above zero
        expect(details.locator(".throughput svg polyline")).to_have_count(1, timeout=30_000)
        expect(details.locator(".throughput .value")).to_contain_text(re.compile(r"max [1-9]"), timeout=30_000)
        expect(details.locator(".lag svg polyline")).to_have_count(1)
        streaming.join()
        screenshot(page, deployment, "status-connector-details")
        fetched = "performance.getEntriesByType('resource').map(entry => entry.name)"
        assert [url for url in page.evaluate(fetched) if not url.startswith(worker.url)] == []  # nothing else


def test_pause_resume_restart_and_delete_buttons_act_once_confirmed(deployment: Deployment) -> None:
    """Each button asks first; confirmed, it calls the REST endpoint; cancelled, nothing changes. Restarting
    (or killing) the task keeps the dead-letter count: it comes from the committed offsets, and equals what
    the dead-letter topic holds read_committed."""
    worker, bootstrap = deployment.worker, deployment.bootstrap
    with browser_page() as page:
        page.goto(f"{worker.url}/ui")
        expect(row(page, "live").locator("td.state")).to_have_text("RUNNING")

        assert "Pause connector \"live\"" in click_confirmed(page, "live", "pause")
        wait_for("live paused", lambda: state(worker, "live") == "PAUSED" and task_is(worker, "live", "PAUSED"), 60)
        expect(row(page, "live").locator("span.task-state")).to_have_text("PAUSED")
        screenshot(page, deployment, "status-paused-by-button")
        click_confirmed(page, "live", "resume")
        before = wait_for("live running", lambda: (task := task_is(worker, "live", "RUNNING")) and task["pid"], 60)

        click_confirmed(page, "live", "restart")
        restarted = wait_for("live restarted", lambda: (task := task_is(worker, "live", "RUNNING")) and
                             task["pid"] not in (None, before) and task["pid"], 60)
        committed = len(read_dead_letters(bootstrap, deployment.dead_letter_topic("live")))
        assert committed == BAD
        assert status(worker, "live")["dead_letters"] == committed
        os.kill(restarted, signal.SIGKILL)  # this worker gives up on a task after one failure
        wait_for("live failed after its task was killed", lambda: state(worker, "live") == "FAILED", 60)
        assert status(worker, "live")["dead_letters"] == committed  # no process counts them now
        expect(row(page, "live").locator("td.dead-letters")).to_have_text(str(committed))
        click_confirmed(page, "live", "restart")
        wait_for("live running again", lambda: state(worker, "live") == "RUNNING", 60)
        assert status(worker, "live")["dead_letters"] == committed

        click_confirmed(page, "idle", "delete", accept=False)
        page.wait_for_timeout(2_500)  # a refresh later, it is still there
        assert state(worker, "idle") == "PAUSED"
        expect(row(page, "idle")).to_have_count(1)
        assert "Delete connector \"idle\"" in click_confirmed(page, "idle", "delete")
        wait_for("idle deleted", lambda: state(worker, "idle") is None, 30)
        expect(row(page, "idle")).to_have_count(0)


def test_with_a_token_the_page_asks_for_it_then_reads_and_acts(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"ui-token-{uuid.uuid4().hex[:8]}"
    worker = start_worker(tmp_path, kafka_bootstrap, prefix, "w1", token="s3cret-token")
    try:
        input_of(kafka_bootstrap, prefix, "guarded")
        with worker.client() as client:
            client.create("guarded", config(prefix, "guarded"))
        wait_for("guarded running", lambda: state(worker, "guarded") == "RUNNING", 60)
        with browser_page() as page:
            page.goto(f"{worker.url}/ui")
            expect(page.locator("#token-form")).to_be_visible()
            expect(page.locator("#banner")).to_contain_text("Unauthorized")
            page.fill("#token", "s3cret-token")
            page.click("#token-form button[type=submit]")
            expect(row(page, "guarded").locator("td.state")).to_have_text("RUNNING")
            expect(page.locator("#token-form")).to_be_hidden()
            click_confirmed(page, "guarded", "pause")
            wait_for("guarded paused", lambda: state(worker, "guarded") == "PAUSED", 60)
    finally:
        worker.kill()
