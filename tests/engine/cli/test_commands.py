"""The command line loads only the module of the command it is given, and still knows every command."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.cli import COMMAND_MODULES, build_parser, command_named_in, main
from tests.helpers import REPO_ROOT
from tests.helpers.closing_port import closing_port


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


GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03"
PNG_HEADER = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"
VALID_CONFIG = ("name: text-files\nsource: {topic: in, format: json, schema: schema.json}\n"
                "sink: {topic: out, format: json}\ndead_letter: {topic: dlq}\n")
NOT_UTF8 = "save it as UTF-8, or is it the right file?"
WRONG_FILES = {
    "gzip": (GZIP_HEADER, f"is not UTF-8 text (byte 0x8b at offset 1): {NOT_UTF8}"),
    "png": (PNG_HEADER, f"is not UTF-8 text (byte 0x89 at offset 0): {NOT_UTF8}"),
    "latin-1": ("name: caf\xe9\n".encode("latin-1"), f"is not UTF-8 text (byte 0xe9 at offset 9): {NOT_UTF8}"),
    "utf-16": (VALID_CONFIG.encode("utf-16"), f"is not UTF-8 text (byte 0xff at offset 0): {NOT_UTF8}"),
    "nul bytes": (b"name: x\n\0\0\0\0", "is a binary file, not text (a NUL byte at offset 8): is it the right file?"),
    "huge": (b"# padding\n" * 420_000,
             "is larger than 4 MiB, the limit for a config or schema file: is it the right file?"),
}
"""What a file named by mistake holds, and the end of the one line that says so."""


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("kind", WRONG_FILES)
def test_a_config_file_that_is_not_utf8_text_or_too_large_is_one_line_naming_it(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    content, problem = WRONG_FILES[kind]
    config = tmp_path / "connector.yaml"
    config.write_bytes(content)

    assert main(["validate", str(config)]) == 2
    assert one_error_line(capsys) == f"epochline: connector config {config} {problem}"


@pytest.mark.parametrize(("schema_format", "kind"), [("json", "schema file"), ("avro", "Avro schema file")])
@pytest.mark.parametrize("wrong", ["gzip", "huge"])
def test_a_schema_file_the_config_names_that_is_not_text_is_one_line_naming_the_schema_file(
        schema_format: str, kind: str, wrong: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "schema.json").write_bytes(WRONG_FILES[wrong][0])
    config = tmp_path / "connector.yaml"
    config.write_text(VALID_CONFIG.replace("format: json, schema", f"format: {schema_format}, schema"))

    assert main(["validate", str(config)]) == 2
    assert one_error_line(capsys) == (f"epochline: invalid connector config {config}: source: "
                                      f"{kind} {tmp_path / 'schema.json'} {WRONG_FILES[wrong][1]}")


def test_epochline_run_of_a_config_that_is_not_utf8_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "connector.yaml"
    config.write_bytes(WRONG_FILES["latin-1"][0])

    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"epochline: connector config {config} {WRONG_FILES['latin-1'][1]}"


def test_epochline_run_against_a_port_where_kafka_is_not_gives_up_in_time_without_hammering_it(
        tmp_path: Path) -> None:
    config = tmp_path / "connector.yaml"
    config.write_text("name: unreachable\nsource: {topic: in, format: json}\nsink: {topic: out, format: json}\n"
                      f"dead_letter: {{topic: dlq}}\ncheckpoint: {{dir: {tmp_path / 'state'}}}\n"
                      "kafka: {connect_timeout: 3s}\n")

    with closing_port() as port:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(config), "--bootstrap-servers",
                               port.bootstrap], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
        attempts = port.accepted

    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(
        f"epochline: unreachable: cannot reach Kafka at {port.bootstrap} within 3s: ")
    assert elapsed < 15
    assert attempts <= 10 * 3, f"{attempts} connections in the 3 s wait"  # about 78 a second before
