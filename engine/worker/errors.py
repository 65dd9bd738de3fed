"""The worker's failures the CLI reports as one line (kept apart so the CLI loads no web framework for them)."""


class WorkerConfigError(ValueError):
    """The worker cannot start as asked (an unsafe bind, a bad name, an unreadable token file)."""


class StoreError(RuntimeError):
    """The configs or status topic could not be written or read back in time; the message names the topic."""


class RecordTooLarge(StoreError):
    """A record is larger than the topic or the producer takes: the request that made it is at fault, not the
    cluster (the REST API answers 400, naming the size)."""
