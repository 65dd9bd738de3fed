"""A task process started ahead: an interpreter that has imported what ``epochline run`` imports and waits
for its command line, so a task the worker starts next skips the interpreter's start and the imports.

Why: a cold ``epochline run`` spends most of its start-up in the interpreter and its imports (pyarrow,
numpy, DuckDB, pydantic, confluent-kafka: 0.5-1.5 s on a 2-core machine, by its load), against 0.15-0.3 s
for the engine's own start (fence, join, first epoch). A worker starts a task on every deploy, config
change, restart and failure; with a warm process the task runs its first epoch that much sooner, the way a
Kafka Connect worker starts tasks inside its running JVM.

The process stays a task of its own, as a cold one is: the worker's child (``subprocess.Popen``, so it is
polled, stopped with SIGTERM and killed exactly as before), in its own session, killed with the worker
(``PR_SET_PDEATHSIG``, armed as a cold task arms it, then the parent checked: a worker gone meanwhile makes
it exit). Nothing of a connector runs in it before the hand-off: it holds no Kafka client, no file of a
task and no config, so what it runs after is what a cold process would run; a connector's own Python
transforms are imported after it too. The hand-off is one JSON line on its stdin (``hand_off``): the
command line after the interpreter (``-m MODULE ARGS`` or ``SCRIPT ARGS``), the task's own environment
variables and its log file, onto which stdout and stderr are moved. An end of input instead exits 0.

What it costs: about 100 MB resident while it waits (43 MB of it its own, the rest shared libraries), and
epochline's modules as they were when it started: after upgrading epochline, restart the workers (as a
Kafka Connect worker is restarted for a new plugin), or a task would run the old modules beside new ones.
"""

from __future__ import annotations

import logging
import os
import runpy
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import orjson

from engine.worker.child import die_with_parent, report_failure

log = logging.getLogger(__name__)
MODULE = "engine.worker.warm"
MAX_EARLY_EXITS = 3
"""Warm processes that exit before their hand-off, in a row, after which a worker stops making them."""


def start_warm(interpreter: str, env: Mapping[str, str], output: Path,
               cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """A warm process of ``interpreter``, in a session of its own, writing to ``output`` until its hand-off."""
    return _start([interpreter, "-m", MODULE], env, output, stdin=subprocess.PIPE, cwd=cwd)


def start_cold(command: Sequence[str], env: Mapping[str, str], log_file: Path,
               cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """``command`` in a process of its own session, as a task: stdin empty, stdout and stderr to ``log_file``."""
    return _start(command, env, log_file, stdin=subprocess.DEVNULL, cwd=cwd)


def _start(command: Sequence[str], env: Mapping[str, str], output: Path, stdin: int,
           cwd: Path | None = None) -> subprocess.Popen[bytes]:
    with open(output, "ab") as log_file:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(list(command), stdin=stdin, stdout=log_file, stderr=subprocess.STDOUT,
                                env=dict(env), cwd=cwd, start_new_session=True)


def hand_off(process: subprocess.Popen[bytes], argv: Sequence[str], env: Mapping[str, str], log_file: Path) -> None:
    """Give ``process`` its command line; it runs it as ``python ARGV...`` would, with ``env`` added to its
    environment and its output appended to ``log_file``. ``BrokenPipeError`` if it has exited."""
    assert process.stdin is not None, "a warm process reads its command line from a pipe"
    order = {"argv": list(argv), "env": dict(env), "log_file": str(log_file)}
    try:
        process.stdin.write(orjson.dumps(order) + b"\n")
        process.stdin.flush()
    finally:
        process.stdin.close()


class TaskLauncher:
    """Starts a worker's tasks: into the warm process when there is a live one, else cold; and keeps one
    warm process ahead.

    The next warm process is made ``settle_s`` after the last start, not at once: its imports take a core
    for about a second, which a task that has just started needs on a 2-core machine. A warm process that
    exits before it was handed a task (killed, by the OOM killer say) is reported and replaced; after
    ``MAX_EARLY_EXITS`` in a row (it cannot import: a broken install) tasks start cold from then on, and a
    cold task reports that error as its own failure.

    Every call comes from the supervisor's thread: ``PR_SET_PDEATHSIG`` ties a child to the thread that
    started it.
    """

    def __init__(self, program: Sequence[str], env: Mapping[str, str], directory: Path, *, warm: bool,
                 settle_s: float = 5.0) -> None:
        self._program = list(program)
        self._env = dict(env)
        self._output = directory / "warm-task.log"
        self._warm_wanted = warm
        self._settle_s = settle_s
        self._warm: subprocess.Popen[bytes] | None = None
        self._last_start = float("-inf")
        self._early_exits = 0

    @property
    def warm_pid(self) -> int | None:
        """The warm process waiting for a task, if any."""
        return self._warm.pid if self._warm is not None else None

    def launch(self, arguments: Sequence[str], env: Mapping[str, str], log_file: Path,
               now: float) -> subprocess.Popen[bytes]:
        """Start the program with ``arguments``, ``env`` added to the worker's task environment."""
        self._last_start = now
        warm, self._warm = self._live_warm(), None
        if warm is not None:
            try:
                hand_off(warm, [*self._program[1:], *arguments], env, log_file)
                self._early_exits = 0
                return warm
            except BrokenPipeError:  # it exited between the check and the hand-off
                self._gone(warm)
        return start_cold([*self._program, *arguments], {**self._env, **env}, log_file)

    def prepare(self, now: float) -> None:
        """Make the warm process, when one is wanted, none is there and the last start has settled. One that
        cannot be made (no memory for a process, say) is reported once; tasks then start cold."""
        if self._live_warm() is not None or not self._warm_wanted or now - self._last_start < self._settle_s:
            return  # (a warm process found dead first: that may be what stops them)
        try:
            self._output.parent.mkdir(parents=True, exist_ok=True)
            self._warm = start_warm(self._program[0], self._env, self._output)
        except OSError as error:
            self._warm_wanted = False
            log.warning("cannot start a warm task process: tasks start cold from now on", extra={"error": str(error)})
            return
        log.debug("warm task process started", extra={"pid": self._warm.pid})

    def close(self) -> None:
        """Kill the warm process: it holds nothing of a connector yet."""
        warm, self._warm = self._warm, None
        if warm is not None:
            warm.kill()
            warm.wait(timeout=10)

    def _live_warm(self) -> subprocess.Popen[bytes] | None:
        if self._warm is not None and self._warm.poll() is not None:
            self._gone(self._warm)
            self._warm = None
        return self._warm

    def _gone(self, warm: subprocess.Popen[bytes]) -> None:
        warm.wait()
        self._early_exits += 1
        self._warm_wanted = self._early_exits < MAX_EARLY_EXITS
        log.warning("the warm task process exited before it was given a task: another is made" if self._warm_wanted
                    else "the warm task process exited before it was given a task: tasks start cold from now on",
                    extra={"pid": warm.pid, "exit_code": warm.returncode, "output": str(self._output),
                           "exits_in_a_row": self._early_exits})


def _take_output(log_file: str) -> None:
    """stdout and stderr onto the task's log (appended), stdin onto /dev/null: a cold task's descriptors."""
    out = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # less the umask, as open() does
    devnull = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((devnull, 0), (out, 1), (out, 2)):
        os.dup2(source, target)
    os.close(out)
    os.close(devnull)


def _run(argv: Sequence[str]) -> None:
    """Run ``argv`` as the interpreter runs its arguments: ``-m MODULE ARGS`` or ``SCRIPT ARGS``."""
    if len(argv) >= 2 and argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as the interpreter puts a script's folder
        runpy.run_path(argv[0], run_name="__main__")


def main() -> int:
    die_with_parent()
    import engine.cli.connector  # noqa: F401  what every task imports, and most of a cold start's time

    line = sys.stdin.buffer.readline()
    if not line:
        return 0
    order = orjson.loads(line)
    os.environ.update(order["env"])
    try:
        _take_output(order["log_file"])
    except OSError as error:  # the task's log cannot be written: its error file says why, as a cold task's would
        report_failure(error)
        raise
    _run(order["argv"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
