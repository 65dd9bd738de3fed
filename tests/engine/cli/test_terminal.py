"""What a person at a terminal sees: readable log lines and a progress bar; JSON lines when asked for."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import orjson

from connectors.admin import create_topic
from engine.testing.connectors import produce_values, write_config
from tests.helpers import REPO_ROOT

RECORDS = 30_000
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_under_a_terminal(argv: list[str], timeout: float = 120.0) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; returns its exit code and what it printed."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary, cwd=REPO_ROOT,
                               env={**os.environ, "COLUMNS": "120", "TERM": "xterm-256color"})
    os.close(secondary)
    output = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # the terminal closed: the process exited
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None:
                break
        code = process.wait(max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(primary)
    return code, ANSI_ESCAPE.sub("", output.decode(errors="replace"))


def connector(kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> Path:
    source, sink = f"{unique_topic}-in", f"{unique_topic}-out"
    for topic in (source, sink, f"{sink}-dlq"):
        create_topic(kafka_bootstrap, topic, 2)
    produce_values(kafka_bootstrap, source, [orjson.dumps({"id": i, "amount": float(i)}) for i in range(RECORDS)], 2)
    return write_config(tmp_path, {
        "name": unique_topic,
        "source": {"topic": source, "format": "json", "max_batch_records": 500},
        "transform": [{"python": "tests.helpers.transforms:slow"}, {"sql": "SELECT id, amount FROM input"}],
        "sink": {"topic": sink, "format": "json"},
        "dead_letter": {"topic": f"{sink}-dlq"},
        "checkpoint": {"interval": "500ms", "dir": str(tmp_path / "state")},
    })


def epochline(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", *args]


def test_on_a_terminal_logs_are_text_lines_and_a_run_to_the_end_shows_a_progress_bar(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    config = connector(kafka_bootstrap, unique_topic, tmp_path)

    code, shown = run_under_a_terminal(epochline("run", str(config), "--bootstrap-servers", kafka_bootstrap,
                                                 "--stop-at-end"))

    assert code == 0, shown
    lines = [line.strip() for line in shown.replace("\r", "\n").splitlines() if line.strip()]
    assert not [line for line in lines if line.startswith("{")], "JSON log lines on a terminal"
    assert any("checkpoint committed" in line and "checkpoint_id=" in line for line in lines), shown[-3000:]
    assert any("records" in line and "records/s" in line and "/" in line for line in lines), shown[-2000:]
    assert any(f"{RECORDS}/{RECORDS}" in line.replace(",", "") for line in lines), shown[-2000:]


def test_with_log_format_json_every_line_on_the_terminal_is_a_json_object(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    config = connector(kafka_bootstrap, unique_topic, tmp_path)

    code, shown = run_under_a_terminal(epochline("--log-format", "json", "run", str(config), "--bootstrap-servers",
                                                 kafka_bootstrap, "--stop-at-end"))

    assert code == 0, shown
    lines = [line for line in shown.splitlines() if line.strip()]
    assert lines
    events = [orjson.loads(line) for line in lines]  # raises on any line that is not JSON
    assert any(event["event"] == "checkpoint committed" for event in events)
