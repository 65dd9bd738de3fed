"""kafka-streams-eos: builds bench/kstreams/BenchStreams.java once and gives the command line that runs it.

    python bench/kafka_streams.py      # build (or find the cached build) and print where it is and how long it took

The build has two steps, each bounded in time, and a failure names its step:

1. ``mvn dependency:copy-dependencies`` on bench/kstreams/pom.xml copies Kafka Streams (the broker's version,
   ``engine.testing.local_broker.KAFKA_VERSION``, passed as ``-Dkafka.version`` the way the broker's own fetch
   does), Jackson and the log4j SLF4J binding into ``<cache>/kstreams-<version>/libs-<hash of the pom>``;
2. ``javac`` compiles BenchStreams.java against them into ``<cache>/kstreams-<version>/classes-<hash of the pom,
   the .java and log4j2.properties>`` (with log4j2.properties beside the classes).

``<cache>`` is the project's jar cache (``EPOCHLINE_CACHE`` or ``~/.cache/epochline``, where the broker's jars
are). Each directory is filled under a temporary name and renamed when complete, so an interrupted build is
never taken for a finished one, and a changed pom or source builds anew while an unchanged one costs nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.testing.local_broker import KAFKA_VERSION, MVN_TIMEOUT_S, cache_dir, copy_runtime_jars_command

SOURCE_DIR = Path(__file__).resolve().parent / "kstreams"
POM = SOURCE_DIR / "pom.xml"
JAVA_SOURCE = SOURCE_DIR / "BenchStreams.java"
LOG_CONFIG = SOURCE_DIR / "log4j2.properties"
MAIN_CLASS = "BenchStreams"
JAVAC_TIMEOUT_S = 300.0
TOOLS = {
    "java": "run Kafka Streams (Debian: apt-get install openjdk-17-jre-headless)",
    "javac": "compile bench/kstreams/BenchStreams.java (Debian: apt-get install openjdk-17-jdk-headless)",
    "mvn": "fetch the Kafka Streams jars from Maven Central (Debian: apt-get install maven)",
}


class KafkaStreamsBuildError(RuntimeError):
    """A tool is missing, or a build step failed or ran past its time limit; the message names the step."""


def missing_tool() -> str | None:
    """Why the contender cannot be built or run here (a tool not on PATH), or None when all are there."""
    for tool, purpose in TOOLS.items():
        if shutil.which(tool) is None:
            return f"'{tool}' is not on PATH; it is needed to {purpose}"
    return None


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Build:
    """A finished build: the dependency jars and the compiled classes (with the log4j2 config beside them)."""

    libs: Path
    classes: Path

    @property
    def classpath(self) -> str:
        return f"{self.classes}{os.pathsep}{self.libs}/*"

    @property
    def log_config(self) -> Path:
        return self.classes / LOG_CONFIG.name


def build_dirs() -> Build:
    """Where the build for the current pom and sources lives (whether or not it exists yet)."""
    home = cache_dir() / f"kstreams-{KAFKA_VERSION}"
    pom = POM.read_bytes()
    libs_key = _digest(KAFKA_VERSION.encode(), pom)
    classes_key = _digest(KAFKA_VERSION.encode(), pom, JAVA_SOURCE.read_bytes(), LOG_CONFIG.read_bytes())
    return Build(home / f"libs-{libs_key}", home / f"classes-{classes_key}")


def _run_step(step: str, command: list[str], timeout: float) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise KafkaStreamsBuildError(f"{step} did not finish within {timeout:.0f}s: {' '.join(command)}") from None
    except OSError as error:
        raise KafkaStreamsBuildError(f"{step} could not start: {error}") from None
    if done.returncode != 0:
        output = (done.stdout[-2000:] + done.stderr[-2000:]).strip() or "(no output)"
        raise KafkaStreamsBuildError(f"{step} exited {done.returncode}:\n{output}")


def _fill_atomically(target: Path, fill: Callable[[Path], None]) -> None:
    """Run ``fill(partial_dir)``, then rename the partial directory to ``target`` (a build interrupted half-way
    leaves only a partial directory, never a target that looks complete)."""
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        fill(partial)
        partial.rename(target)
    except OSError:
        if not target.is_dir():  # else another process finished the same build first; its copy is complete
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def build(mvn_timeout: float = MVN_TIMEOUT_S, javac_timeout: float = JAVAC_TIMEOUT_S) -> Build:
    """The cached build for the current sources, building what is missing first; raises KafkaStreamsBuildError."""
    dirs = build_dirs()
    if (dirs.classes / f"{MAIN_CLASS}.class").exists() and dirs.libs.is_dir():
        return dirs
    missing = missing_tool()
    if missing is not None:
        raise KafkaStreamsBuildError(missing)
    if not dirs.libs.is_dir():
        def copy_jars(into: Path) -> None:
            _run_step("mvn dependency:copy-dependencies (bench/kstreams/pom.xml)",
                      copy_runtime_jars_command(shutil.which("mvn") or "mvn", POM, into), mvn_timeout)
        _fill_atomically(dirs.libs, copy_jars)

    def compile_sources(into: Path) -> None:
        _run_step("javac bench/kstreams/BenchStreams.java", [
            shutil.which("javac") or "javac", "--release", "17", "-nowarn", "-d", str(into),
            "-cp", f"{dirs.libs}/*", str(JAVA_SOURCE),
        ], javac_timeout)
        shutil.copyfile(LOG_CONFIG, into / LOG_CONFIG.name)
    _fill_atomically(dirs.classes, compile_sources)
    return dirs


def java_command(built: Build, *, bootstrap: str, input_topic: str, output_topic: str, dead_letter_topic: str,
                 application_id: str, threads: int, state_dir: Path, bounded: bool) -> list[str]:
    """The argv that runs the application: ``java`` itself, so the JVM is the harness's direct child and
    ``wait4`` reports its CPU and RSS."""
    command = [
        shutil.which("java") or "java", f"-Dlog4j2.configurationFile={built.log_config}",
        "-cp", built.classpath, MAIN_CLASS,
        "--bootstrap", bootstrap, "--input", input_topic, "--output", output_topic,
        "--dead-letter", dead_letter_topic, "--application-id", application_id,
        "--threads", str(threads), "--state-dir", str(state_dir),
    ]
    return command + (["--bounded"] if bounded else [])


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    started = time.monotonic()
    try:
        built = build()
    except KafkaStreamsBuildError as error:
        print(f"kafka-streams-eos build failed: {error}", file=sys.stderr)
        return 1
    print(f"jars:    {built.libs}\nclasses: {built.classes}\n({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
