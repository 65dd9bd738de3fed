"""A stand-in for ``epochline run`` that the supervisor's specifications start instead of a real task.

It takes the task's command line (``--log-format json run CONFIG --instance W --bootstrap-servers B``) and
behaves as the config's ``name`` says: ``runs-*`` runs until SIGTERM and exits 0 (a task that commits and
stops), ``stubborn-*`` ignores SIGTERM (a task stuck committing), ``fails-*`` reports an error through the
worker's error file and exits 2 (a task that halts). Each start appends its PID to ``starts/<name>.log`` in
the worker's state dir (which outlives the task's own folder, removed with its connector), so a test can
count starts.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import yaml

from engine.worker.child import ERROR_FILE_ENV


def main(argv: list[str]) -> int:
    config_path = Path(argv[argv.index("run") + 1])
    name = yaml.safe_load(config_path.read_text())["name"]
    starts_log = config_path.parents[3] / "starts" / f"{name}.log"  # the worker's state dir
    starts_log.parent.mkdir(exist_ok=True)
    with open(starts_log, "a") as starts:
        starts.write(f"{os.getpid()}\n")
    if name.startswith("fails"):
        Path(os.environ[ERROR_FILE_ENV]).write_text(
            '{"type": "PipelineHalted", "message": "failing on purpose", "trace": "Traceback: failing on purpose"}')
        return 2
    if name.startswith("stubborn"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
