"""Helpers the specifications share: connector processes, a PostgreSQL server, sample schemas, transforms."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "examples"
