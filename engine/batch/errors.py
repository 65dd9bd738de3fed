"""Why a batch job could not go on."""

from __future__ import annotations


class BatchJobError(RuntimeError):
    """A batch job cannot go on; the message names the batch, item, topic or file involved."""


class PlanFileMissing(BatchJobError):
    """The store knows the batch but its frozen plan file is gone: re-planning would change the ranges."""


class BatchHalted(BatchJobError):
    """A poison record or transform error with ``on_error: halt``: the job stopped without committing the item."""


class BatchNotFound(BatchJobError):
    """A census or attention list was asked for a batch id the store never opened (mistyped id?)."""
