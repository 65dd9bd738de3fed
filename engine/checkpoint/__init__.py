"""The exactly-once protocol (DESIGN.md, "One epoch, start to end"), in one package.

Four modules, one question each:

- ``coordinator``: *whose state*. ``CheckpointCoordinator`` is the seam every operator's state is
  registered with, captured through into a checkpoint (``CheckpointStorage``: the changelog topics in the
  runtime, or local files) and restored from; it reserves the ids.
- ``loop``: *when*. ``EpochLoop`` runs the cycle loop, decides when a checkpoint is due,
  injects the barrier into every source at one point of the loop, and chooses commit or abandon.
- ``pipeline``: *what*. ``KafkaPipeline`` is the ``PipelineCallback`` that runs operators, writes the
  sink, captures state and commits the epoch's Kafka transaction.
- ``runner``: *again?* ``run_connector`` restarts the pipeline in process after recoverable failures
  (a lost broker, a wedged producer) and stops clearly on the others (fencing, poison input, bad state).

The steps of one epoch N, and the function that does each:

1. **Reserve** N durably: ``KafkaPipeline.reserve_checkpoint_attempt`` →
   ``CheckpointCoordinator.trigger_checkpoint`` → ``CheckpointIdLog.reserve``
   (appended and fsynced before use; an abandoned N is burned for ever; ids are per instance, and the
   offset metadata names the instance too, so the pair names one epoch of the whole group).
2. **Barrier**: ``EpochLoop.checkpoint`` calls ``KafkaSource.inject_barrier`` on every source;
   the cut is the position after the last record handed out, so later records belong to N+1.
3. **Drain**: nothing to wait for: every record handed out before the cut already went through
   ``KafkaPipeline.execute_cycle`` and ``write_to_sinks`` into the open transaction (output, dead letters,
   repartitioned rows). The loop polls one source per cycle, so this holds also when a rebalance
   callback commits the epoch in the middle of a poll.
4. **Capture**: ``KafkaPipeline._capture_keyed_state`` → ``CheckpointCoordinator.capture_checkpoint``:
   every partition whose keyed state changed is written to its changelog partition
   (``KafkaChangelogStorage``), in the same transaction; each offset carries its partition's largest
   event time in its metadata.
5. **Commit point**: ``TransactionalKafkaSink.commit_epoch``: ``flush``, ``send_offsets_to_transaction``
   per source with the consumer's group metadata read now (a member whose partitions moved is refused) and
   ``epochline:checkpoint=N;instance=I;event_time=T;at=MS;dead_letters=D`` (``connectors.offset_metadata``;
   ``D`` counts the partition's dead letters of every committed epoch, this one's included),
   ``commit_transaction``. When it returns, epoch N exists; nothing before counts. Only then
   ``CheckpointCoordinator.complete_checkpoint(N, success=True)``. With a sink beyond Kafka
   (``sinks.api.ExternalSink``) the step is two-phase: ``KafkaPipeline._prepare_external`` prepares the
   sink's epoch under N first, the Kafka transaction decides, ``_finish_external`` publishes it after.
6. **Abandon**: ``EpochLoop._rewind`` → ``KafkaPipeline.abandon_checkpoint_attempt``: abort the
   transaction (and the external sink's epoch), fail N in the coordinator (``complete_checkpoint(N,
   success=False)``: N stays burned), give every owned partition back its committed keyed state
   (``CheckpointCoordinator.restore_partitions``, from the changelog) and event time, rewind every source to
   its committed offsets.

**Partitions move** (``KafkaPipeline`` is the sources' ``PartitionListener``, called inside the rebalance
callbacks): on assignment a partition's committed offset and metadata are read, its keyed state restored
from the changelog (``CheckpointCoordinator.restore_partitions``), before any of its records is processed
(``assigned``); on revocation the whole epoch commits while the partitions are still owned (``revoked``); on
loss it is abandoned (``lost``).

**Start-up** (``KafkaPipeline.recover``): the sink's topics exist (``KafkaWriter.check_topics``; a missing
one is permanent), then ``init_transactions`` with the instance's stable transactional.id fences its
previous incarnation and aborts its open transaction; the instance's state directory lock is
taken; an external sink is opened and resolves what the previous incarnation left prepared by the checkpoint
the committed offsets say this instance committed last (``_recover_external_sink``); the internal topics exist
(changelogs, repartition); the sources subscribe. Unreadable offset
metadata is a ``RecoveryError`` (``_epoch_named_by``).
"""

from engine.checkpoint.coordinator import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailed,
    CheckpointMetadata,
    OperatorAlreadyRegistered,
    OperatorState,
    PeriodicCheckpointing,
    SnapshotFailed,
    UnknownCheckpoint,
)
from engine.checkpoint.loop import (
    CheckpointAbandoned,
    CheckpointAttempt,
    ControlMessage,
    CycleFailed,
    EpochControl,
    EpochLoop,
    EpochLoopError,
    EpochLoopSettings,
    ImmediateStop,
    PipelineCallback,
    PipelineHalted,
    Source,
)
from engine.checkpoint.pipeline import KafkaPipeline, RecoveryError
from engine.checkpoint.runner import ConnectorFailed, RunOptions, bootstrap_from, run_connector
from engine.state.storage import CheckpointNotFound, CheckpointStorage, FileCheckpointStorage, StateKey

__all__ = [
    "CheckpointAbandoned",
    "CheckpointAttempt",
    "CheckpointCoordinator",
    "CheckpointCoordinatorConfig",
    "CheckpointFailed",
    "CheckpointMetadata",
    "CheckpointNotFound",
    "CheckpointStorage",
    "ConnectorFailed",
    "ControlMessage",
    "CycleFailed",
    "EpochControl",
    "EpochLoop",
    "EpochLoopError",
    "EpochLoopSettings",
    "FileCheckpointStorage",
    "ImmediateStop",
    "KafkaPipeline",
    "OperatorAlreadyRegistered",
    "OperatorState",
    "PeriodicCheckpointing",
    "PipelineCallback",
    "PipelineHalted",
    "RecoveryError",
    "RunOptions",
    "SnapshotFailed",
    "Source",
    "StateKey",
    "UnknownCheckpoint",
    "bootstrap_from",
    "run_connector",
]
