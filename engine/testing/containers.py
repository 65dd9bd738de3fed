"""``KafkaContainer``: one single-node KRaft broker in a Docker container, through testcontainers.

The container shares the host's network namespace, so the broker listens on 127.0.0.1 like the embedded
broker and no port mapping is involved (Linux Docker engines). testcontainers is the ``epochline[testing]``
extra; it is imported only when a container is asked for.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Protocol

from engine.ports import free_port
from engine.testing.errors import ContainerStartFailed
from engine.testing.local_broker import (
    KAFKA_VERSION,
    BrokerStartFailed,
    server_properties,
    wait_until_transactions_work,
)

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

log = logging.getLogger(__name__)

IMAGE_ENV = "EPOCHLINE_KAFKA_IMAGE"
DEFAULT_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
CONTAINER_DATA_DIR = Path("/tmp/epochline-kafka")  # writable in apache/kafka (runs as appuser) and ours


def kafka_image() -> str:
    """The Kafka image containers use: ``EPOCHLINE_KAFKA_IMAGE``, else the official ``apache/kafka``."""
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers a ping (``DOCKER_HOST`` or the default socket), else why not."""
    import requests

    import docker

    try:
        client = _docker_from_env(timeout=5)
    except docker.errors.DockerException as error:
        return f"no Docker engine is reachable ({error})"
    try:
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as error:
        return f"the Docker engine did not answer a ping ({error})"
    finally:
        client.close()
    return None


class _DockerClient(Protocol):
    """The part of the docker SDK's ``DockerClient`` used here."""

    def ping(self) -> bool: ...

    def close(self) -> None: ...


def _docker_from_env(timeout: int) -> _DockerClient:
    """``docker.from_env``, typed. mypy resolves ``import docker`` to this repository's ``docker/`` folder (a
    namespace package without ``from_env``) rather than the untyped SDK, so the call goes through ModuleType."""
    import docker

    sdk: ModuleType = docker
    client: _DockerClient = sdk.from_env(timeout=timeout)
    return client


def broker_environment(port: int, controller_port: int) -> dict[str, str]:
    """The container's settings in the official apache/kafka image's convention (``KAFKA_LOG_DIRS`` means
    ``log.dirs``), taken from the embedded broker's settings so both brokers behave the same: single-node
    KRaft, replication 1 for offsets and transaction state, listeners on 127.0.0.1."""
    settings = dict(
        line.split("=", 1)
        for line in server_properties(CONTAINER_DATA_DIR, port, controller_port).splitlines()
    )
    environment = {_property_to_env(key): value for key, value in settings.items()}
    environment["CLUSTER_ID"] = uuid.uuid4().hex[:22]
    return environment


def _property_to_env(key: str) -> str:
    """``transaction.state.log.min.isr`` -> ``KAFKA_TRANSACTION_STATE_LOG_MIN_ISR`` ('_' is doubled, '-'
    tripled), the inverse of what the image's KafkaDockerWrapper applies."""
    return "KAFKA_" + key.replace("_", "__").replace("-", "___").replace(".", "_").upper()


@dataclass
class KafkaContainer:
    """One single-node KRaft Kafka broker in a container on the host network, started by testcontainers.

    ``start`` returns only once a transactional producer can ``init_transactions``, and ``stop`` removes
    the container with its volumes. Ryuk (testcontainers' reaper for crashed sessions) follows
    ``TESTCONTAINERS_RYUK_DISABLED``; without registry access it must be disabled.
    """

    image: str = field(default_factory=kafka_image)
    startup_timeout: float = 120.0
    bootstrap: str | None = None
    _container: DockerContainer | None = None

    def start(self) -> str:
        from testcontainers.core.container import DockerContainer

        import docker

        port = free_port()
        controller_port = free_port(besides={port})
        container = (
            DockerContainer(self.image)
            .with_envs(**broker_environment(port, controller_port))
            .with_kwargs(network_mode="host", labels={"org.epochline.role": "kafka-test-broker"})
        )
        try:
            container.start()
        except docker.errors.DockerException as error:
            raise ContainerStartFailed(f"starting a container from {self.image} failed: {error}") from error
        self._container = container
        bootstrap = f"127.0.0.1:{port}"
        try:
            wait_until_transactions_work(bootstrap, self.startup_timeout, self._is_running)
        except BrokerStartFailed as failure:
            output = self._output_tail()
            self.stop()
            raise ContainerStartFailed(f"{failure} (image {self.image})\nlast container output:\n{output}") from None
        self.bootstrap = bootstrap
        log.info("kafka container started",
                 extra={"image": self.image, "container": container.get_wrapped_container().short_id,
                        "bootstrap": bootstrap})
        return bootstrap

    def _is_running(self) -> bool:
        assert self._container is not None
        self._container.reload()
        return self._container.status == "running"

    def _output_tail(self, lines: int = 20) -> str:
        assert self._container is not None
        stdout, stderr = self._container.get_logs()
        return "\n".join((stdout + stderr).decode(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Remove the container (forced, with its anonymous volumes); a stopped container is a no-op."""
        if self._container is not None:
            self._container.stop()
            log.info("kafka container removed", extra={"image": self.image, "bootstrap": self.bootstrap})
        self._container = None
        self.bootstrap = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
