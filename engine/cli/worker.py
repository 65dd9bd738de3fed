"""``epochline worker --cluster NAME``: one worker of a cluster that runs connectors deployed over REST."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from pydantic import ValidationError

from engine import secrets
from engine.bounded_yaml import read_yaml
from engine.checkpoint import bootstrap_from
from engine.cli.common import CommandFailed, add_bootstrap_argument
from engine.config import KafkaConfig
from engine.worker.client import TokenFileError, token_from
from engine.worker.supervisor import SupervisorSettings
from schemas.text_files import TextFileError, read_text_file


def rest_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8083`` for IPv6); a bad one is a usage error naming it."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"--rest wants HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def worker_client_config(path: Path | None) -> dict[str, str]:
    """The worker's own Kafka settings from a YAML mapping: the keys ``kafka.client`` takes in a connector
    config (``security.protocol``, ``sasl.*``, ``ssl.*``), values possibly ``${env:…}``/``${file:…}``."""
    if path is None:
        return {}
    try:
        raw = read_yaml(read_text_file(path, "--kafka-client file"))
        settings = KafkaConfig(client=raw if raw is not None else {}).client
        return secrets.resolve_all(settings, path.parent)
    except TextFileError as error:
        raise CommandFailed(str(error)) from error
    except (yaml.YAMLError, ValidationError, secrets.SecretReferenceError) as error:
        raise CommandFailed(f"--kafka-client {path}: {error}") from error


def _worker(args: argparse.Namespace) -> int:
    try:
        token = token_from(args.api_token_file)
    except TokenFileError as error:
        raise CommandFailed(str(error)) from error
    from engine.worker.worker import WorkerOptions, run_worker  # the web framework, for this command only

    host, port = args.rest
    bootstrap = bootstrap_from(args.bootstrap_servers)
    supervision = SupervisorSettings(worker_id="", bootstrap=bootstrap, state_dir=args.state_dir,
                                     max_failures=args.max_task_failures, backoff_s=args.task_backoff,
                                     warm_task=args.warm_task)
    run_worker(WorkerOptions(cluster=args.cluster, bootstrap=bootstrap, host=host, port=port, instance=args.instance,
                             state_dir=args.state_dir, token=token, supervision=supervision,
                             allowed_hosts=tuple(args.rest_allowed_hosts),
                             client_config=worker_client_config(args.kafka_client)))
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    worker = commands.add_parser("worker", help="join a worker cluster: run its connectors, serve its REST API")
    worker.add_argument("--cluster", required=True, help="the cluster's name: its topics are <cluster>-configs "
                                                          "and <cluster>-status")
    worker.add_argument("--rest", type=rest_address, default=("127.0.0.1", 8083), metavar="HOST:PORT",
                        help="where the REST API listens (default 127.0.0.1:8083; any other than loopback "
                             "needs a token)")
    worker.add_argument("--rest-allowed-hosts", type=lambda text: [name for name in text.split(",") if name],
                        default=[], metavar="NAME[,NAME...]",
                        help="host names the REST API answers to besides IP addresses, localhost and the --rest "
                             "host (requests naming any other Host are refused: DNS rebinding)")
    worker.add_argument("--instance", help="this worker's stable name (default: $EPOCHLINE_INSTANCE, else a name "
                                           "generated once and kept in the state dir); its tasks are named after it")
    worker.add_argument("--state-dir", type=Path, default=Path("state") / "worker",
                        help="where this worker keeps its tasks' files (default ./state/worker)")
    worker.add_argument("--api-token-file", type=Path,
                        help="a file holding the API token (default: $EPOCHLINE_API_TOKEN; none: no auth)")
    worker.add_argument("--kafka-client", type=Path, metavar="FILE",
                        help="a YAML mapping of the worker's own Kafka security settings (security.protocol, "
                             "sasl.*, ssl.*; values may be ${env:NAME} or ${file:PATH:KEY})")
    worker.add_argument("--max-task-failures", type=int, default=5, metavar="N",
                        help="a task that exits N times within 5 minutes is FAILED until restarted (default 5)")
    worker.add_argument("--task-backoff", type=float, default=1.0, metavar="SECONDS",
                        help="wait before restarting a task that exited; doubles per failure, at most 60 s "
                             "(default 1)")
    worker.add_argument("--no-warm-task", dest="warm_task", action="store_false",
                        help="start every task in a new process, instead of in one kept ahead with its modules "
                             "imported (which saves most of a task's start-up and holds about 100 MB)")
    add_bootstrap_argument(worker)
    worker.set_defaults(handler=_worker)
