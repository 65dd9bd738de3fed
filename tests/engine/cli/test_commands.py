"""The command line loads only the module of the command it is given, and still knows every command."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from engine.cli import COMMAND_MODULES, build_parser, command_named_in, main
from tests.helpers import REPO_ROOT


def command_names(parser: argparse.ArgumentParser) -> set[str]:
    subcommands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return set(subcommands.choices)


@pytest.mark.parametrize(("argv", "command"), [
    (["run", "c.yaml", "--stop-at-end"], "run"),
    (["--log-level", "DEBUG", "--log-format", "json", "status", "c.yaml"], "status"),
    (["--log-level=DEBUG", "connectors", "list"], "connectors"),
    (["--help"], None),
    (["no-such-command"], None),
    (["--log-format"], None),  # a global option without its value: the full parser names the problem
    ([], None),
])
def test_the_command_is_the_first_word_after_the_global_options(argv: list[str], command: str | None) -> None:
    assert command_named_in(argv) == command


def test_the_parser_for_one_command_holds_its_module_only_and_the_full_one_holds_every_command() -> None:
    assert command_names(build_parser("run")) == {"run", "validate"}
    assert command_names(build_parser()) == set(COMMAND_MODULES)


def test_epochline_run_starts_without_the_rest_client_the_worker_rich_or_formats_it_does_not_use() -> None:
    """Import time is start-up time: ``run`` must not pay for the commands it is not, nor a JSON connector for
    the Avro modules."""
    probe = ("import sys; from engine.cli import build_parser; build_parser('run'); "
             "from schemas import FormatSpec, make_format; make_format(FormatSpec('json')); "
             "print(sorted(m for m in ('httpx', 'rich', 'engine.worker.supervisor', 'engine.cli.connectors', "
             "'fastavro', 'schemas.avro_format', 'schemas.confluent') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    assert loaded == "[]"


def test_an_unknown_command_is_refused_naming_the_commands_there_are(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_a_known_failure_is_one_line_and_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "missing.yaml"]) == 2
    assert capsys.readouterr().err.strip().startswith("epochline: ")
