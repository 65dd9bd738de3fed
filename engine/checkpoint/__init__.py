"""The exactly-once protocol (DESIGN.md, "One epoch, start to end"), in one package.

Three modules, one question each:

- ``coordinator``: *when*. ``StreamingCoordinator`` runs the cycle loop, decides when a checkpoint is due,
  injects the barrier into every source at one point of the loop, and chooses commit or abandon.
- ``pipeline``: *what*. ``KafkaPipeline`` is the ``PipelineCallback`` that runs operators, writes the
  sink, captures state and commits the epoch's Kafka transaction.
- ``runner``: *again?* ``run_connector`` restarts the pipeline in process after recoverable failures
  (a lost broker, a wedged producer) and stops clearly on the others (fencing, poison input, bad state).

The steps of one epoch N, and the function that does each:

1. **Reserve** N durably: ``KafkaPipeline.reserve_checkpoint_attempt`` → ``CheckpointIdLog.reserve``
   (appended and fsynced before use; an abandoned N is burned for ever).
2. **Barrier**: ``StreamingCoordinator.checkpoint`` calls ``KafkaSource.inject_barrier`` on every source;
   the cut is the position after the last record handed out, so later records belong to N+1.
3. **Drain**: nothing to wait for: every record handed out before the cut already went through
   ``KafkaPipeline.execute_cycle`` and ``write_to_sinks`` into the open transaction (output and dead letters).
4. **Capture**: ``KafkaPipeline.checkpoint_with_barrier`` → ``CheckpointCoordinator.trigger_checkpoint``
   and ``persist`` (temp file, fsync, rename, fsync dir, sha256).
5. **Commit point**: ``TransactionalKafkaSink.commit_epoch``: ``flush``, ``send_offsets_to_transaction``
   with ``epochline:checkpoint=N`` (``connectors.offset_metadata``), ``commit_transaction``. When it
   returns, epoch N exists; nothing before counts. Then ``complete_checkpoint`` and ``clear_old_checkpoints``.
6. **Abandon**: ``StreamingCoordinator._rewind`` → ``KafkaPipeline.abandon_checkpoint_attempt``: abort the
   transaction, restore the state of the last committed id, rewind every source to its cut, burn N.

**Recovery**, at every start (``KafkaPipeline.recover``): ``init_transactions`` with the stable
transactional.id fences any zombie and aborts its open transaction; the committed offsets' metadata names
the last committed checkpoint M (``_checkpoint_named_by``; unreadable metadata is a ``RecoveryError``);
exactly M's state is restored (``_restore_committed_state``), state above M is deleted, ids continue above
M, and the sources resume at the committed offsets.
"""

from engine.checkpoint.coordinator import (
    CheckpointAbandoned,
    CheckpointAttempt,
    ControlMessage,
    CoordinatorError,
    CoordinatorSettings,
    CycleFailed,
    EpochControl,
    ImmediateStop,
    PipelineCallback,
    PipelineHalted,
    Source,
    StreamingCoordinator,
)
from engine.checkpoint.pipeline import KafkaPipeline, RecoveryError
from engine.checkpoint.runner import ConnectorFailed, RunOptions, bootstrap_from, run_connector

__all__ = [
    "CheckpointAbandoned",
    "CheckpointAttempt",
    "ConnectorFailed",
    "ControlMessage",
    "CoordinatorError",
    "CoordinatorSettings",
    "CycleFailed",
    "EpochControl",
    "ImmediateStop",
    "KafkaPipeline",
    "PipelineCallback",
    "PipelineHalted",
    "RecoveryError",
    "RunOptions",
    "Source",
    "StreamingCoordinator",
    "bootstrap_from",
    "run_connector",
]
