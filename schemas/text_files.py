"""Reading a file a person named as text: a connector config, a schema it refers to.

A file passed by mistake (a gzip archive, a PNG, a log of gigabytes, a config saved as UTF-16) must end in
one line naming the file and what is wrong with it, not in a ``UnicodeDecodeError`` traceback or in memory
filled by a file that was never a config.
"""

from __future__ import annotations

from pathlib import Path

from schemas.base import SchemaError

MAX_TEXT_FILE_BYTES = 4 * 1024 * 1024
"""The largest config or schema file read (4 MiB): a hundred times the largest real one we know of (a
generated Avro schema of a few thousand fields is about 300 KiB), small enough that a wrong file is refused
before it is parsed."""


class TextFileError(SchemaError):
    """A file that should be text could not be read as text; the message names the file and the problem. A
    configuration error, like every ``SchemaError``: the command line's one line and exit code 2."""


def read_text_file(path: Path, what: str, limit: int = MAX_TEXT_FILE_BYTES) -> str:
    """The UTF-8 text of ``path`` (``what`` says what it is, e.g. "connector config", in the error), read in
    one bounded read: a file larger than ``limit``, with a NUL byte (binary) or not UTF-8 is a
    ``TextFileError``, as is one that cannot be read at all."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as error:
        raise TextFileError(f"cannot read {what} {path}: {error.strerror or error}") from error
    if len(data) > limit:
        raise TextFileError(f"{what} {path} is larger than {_size(limit)}, the limit for a config or schema "
                            f"file: is it the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TextFileError(f"{what} {path} is not UTF-8 text (byte {data[error.start]:#04x} at offset "
                            f"{error.start}): save it as UTF-8, or is it the right file?") from None
    if "\0" in text:  # valid UTF-8, but no config or schema holds a NUL: a binary file
        raise TextFileError(f"{what} {path} is a binary file, not text (a NUL byte at offset {data.index(0)}): "
                            f"is it the right file?")
    return text


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit:,} bytes"
