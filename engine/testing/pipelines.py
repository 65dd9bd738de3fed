"""Running a connector as a user would: ``epochline run ... --stop-at-end`` in its own process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine.testing.errors import KafkaTestError


def run_pipeline(config: Path, bootstrap: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run ``epochline run CONFIG --bootstrap-servers BOOTSTRAP --stop-at-end`` as a separate process, as
    a user would, and return once it has committed all input present at its start; a non-zero exit is an
    error that carries the command's output."""
    command = [sys.executable, "-m", "engine.cli", "run", str(config), "--bootstrap-servers", bootstrap,
               "--stop-at-end"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise KafkaTestError(f"'epochline run {config}' did not finish within {timeout:.0f}s:\n"
                             f"{_text(expired.stdout)}{_text(expired.stderr)}") from None
    if done.returncode != 0:
        raise KafkaTestError(f"'epochline run {config}' exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")
