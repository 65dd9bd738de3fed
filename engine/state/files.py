"""``write_atomically``: a small local file replaced whole and durably, or not at all.

Its users: the checkpoint id log when it is created or compacted (``engine.state.ids``), the checkpoints of
``engine.state.storage.FileCheckpointStorage`` (which also uses ``fsync_directory`` to make its own renames
durable), the generated instance name (``engine.instance``) and a batch job's frozen plan
(``engine.batch.plan``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

_TEMP_SUFFIX = ".tmp"


def fsync_directory(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (POSIX needs the directory itself fsynced)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``path`` so that it either keeps its old content or has all of ``chunks``, durably:
    temp file, fsync, rename over ``path``, fsync of the directory.

    The temp name (``.<name>.tmp`` beside ``path``) is derived from ``path``: every path has one writer
    (the id log has one owner, an instance name and a batch plan are written once), so a stale temp file
    from a crash is simply overwritten. Raises ``OSError``; the temp file is removed on failure.
    """
    temporary = path.with_name(f".{path.name}{_TEMP_SUFFIX}")
    try:
        with open(temporary, "wb") as handle:
            handle.writelines(chunks)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        fsync_directory(path.parent)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
