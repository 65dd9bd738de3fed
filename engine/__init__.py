"""epochline's engine: runs connectors exactly once over Kafka.

- ``checkpoint``: THE exactly-once protocol: the loop (when), the pipeline callback (what), the
  ``CheckpointCoordinator`` every operator's state is checkpointed through, the restart policy; its
  docstring lists every step of an epoch and the function that does it;
- ``state``: keyed state per partition and its changelog topics, the checkpoint id log, the state-dir lock,
  where checkpoints are stored (``CheckpointStorage``);
- ``instance``: which instance of a connector this process is, and the Kafka names derived from it;
- ``transforms``: SQL, Python and window steps;
- ``batch``: bounded exactly-once batch jobs and their ledger;
- ``config`` and ``wiring``: the connector YAML, and the one place it becomes sources, operators and sinks;
  ``secrets`` resolves the references in it; ``validation`` checks it offline and on Kafka;
- ``metrics``, ``logs``, ``cli``: what an operator sees;
- ``testing``: dev tooling (local broker, containers, test helpers, pytest plugin), never imported by the
  runtime.

The public face::

    from engine import load_config, run_connector, RunOptions
    run_connector(load_config("orders-clean.yaml"), RunOptions(bootstrap="127.0.0.1:9092", stop_at_end=True))
"""

from engine.checkpoint import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailed,
    ConnectorFailed,
    FileCheckpointStorage,
    OperatorState,
    RecoveryError,
    RunOptions,
    run_connector,
)
from engine.config import ConfigError, ConnectorConfig, load_config
from engine.validation import checked_config, validate_online

__all__ = [
    "CheckpointCoordinator",
    "CheckpointCoordinatorConfig",
    "CheckpointFailed",
    "ConfigError",
    "ConnectorConfig",
    "ConnectorFailed",
    "FileCheckpointStorage",
    "OperatorState",
    "RecoveryError",
    "RunOptions",
    "checked_config",
    "load_config",
    "run_connector",
    "validate_online",
]
