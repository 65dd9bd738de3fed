"""The layout is part of the design: lower packages never reach up, dev tooling stays off the runtime's path,
and the optional extras are optional."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

LOWER_PACKAGES = ("connectors", "sinks", "schemas")
DEV_TOOLING = "engine.testing"
ENTRY_POINTS = ("engine/testing", "engine/cli")  # may load dev tooling (the CLI lazily, for broker and crash tests)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def modules_of(package: str) -> list[Path]:
    return sorted((REPO_ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", LOWER_PACKAGES)
def test_a_lower_package_never_imports_the_engine(package: str) -> None:
    offenders = {str(path.relative_to(REPO_ROOT)): sorted(m for m in imported_modules(path)
                                                           if m == "engine" or m.startswith("engine."))
                 for path in modules_of(package)}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_the_runtime_never_imports_dev_tooling() -> None:
    runtime = [path for path in modules_of("engine")
               if not any(str(path.relative_to(REPO_ROOT)).startswith(prefix) for prefix in ENTRY_POINTS)]
    offenders = {str(path.relative_to(REPO_ROOT)): sorted(m for m in imported_modules(path)
                                                           if m == DEV_TOOLING or m.startswith(DEV_TOOLING + "."))
                 for path in runtime}
    assert runtime, "no runtime modules found"
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_every_package_says_what_lives_there() -> None:
    packages = [path for top in ("connectors", "engine", "sinks", "schemas")
                for path in (REPO_ROOT / top).rglob("__init__.py")]
    missing = [str(path.relative_to(REPO_ROOT)) for path in packages
               if ast.get_docstring(ast.parse(path.read_text())) is None]
    assert missing == []


WITHOUT_EXTRAS = """
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("testcontainers", "psycopg", "docker", "google", "grpc_tools"):
            raise ImportError(f"No module named {name!r} (blocked by the test)")
        return None

sys.meta_path.insert(0, Missing())
import engine, engine.cli, engine.batch, engine.checkpoint, engine.testing, connectors, sinks, schemas
from engine.batch import BatchStoreError, open_batch_store
from schemas import FormatSpec, SchemaError, make_format
try:
    open_batch_store("postgresql://127.0.0.1:1/none")
except BatchStoreError as error:
    print(error)
try:
    make_format(FormatSpec(format="protobuf-confluent", schema="any.proto"))
except SchemaError as error:
    print(error)
"""


def test_the_library_imports_without_its_optional_extras_and_names_the_missing_one() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_EXTRAS], capture_output=True, text=True, timeout=60,
                          cwd=REPO_ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert "pip install 'epochline[postgres]'" in done.stdout
    assert "pip install 'epochline[protobuf]'" in done.stdout
