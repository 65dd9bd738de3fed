"""A worker on an authenticated Kafka (SASL/SCRAM, ACLs enforced): the worker and its tasks authenticate with
settings given by reference, and the password reaches neither an API answer nor a log line."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest
import yaml

from connectors.admin import create_topic
from engine.testing import LocalWorker, produce_transactions, read_values
from engine.testing.accounting import assert_exactly_once
from engine.testing.auth import ScramKafka
from tests.helpers.worker_process import start_worker, wait_for

pytestmark = [pytest.mark.auth, pytest.mark.timeout(300)]
PASSWORD_VARIABLE = "EPOCHLINE_TEST_WORKER_PASSWORD"
RECORDS = 2_000


def test_a_worker_and_its_tasks_authenticate_by_reference_and_never_show_the_password(
        kafka_scram: ScramKafka, tmp_path: Path) -> None:
    name = f"wauth-{uuid.uuid4().hex[:8]}"
    admin = kafka_scram.admin
    for topic in (f"{name}-in", f"{name}-out", f"{name}-dlq"):
        create_topic(kafka_scram.bootstrap, topic, 2, client_config=admin.settings)
    values = [orjson.dumps({"id": i}) for i in range(RECORDS)]
    produce_transactions(kafka_scram.bootstrap, f"{name}-in", [(values, True)], partitions=2,
                         client_config=admin.settings)
    by_reference = {**admin.settings, "sasl.password": f"${{env:{PASSWORD_VARIABLE}}}"}
    client_file = tmp_path / "kafka-client.yaml"
    client_file.write_text(yaml.safe_dump(by_reference))
    worker: LocalWorker | None = None
    try:
        worker = start_worker(tmp_path, kafka_scram.bootstrap, name, "w1", env={PASSWORD_VARIABLE: admin.password},
                              extra_args=("--kafka-client", str(client_file)))
        config = {"source": {"topic": f"{name}-in", "format": "json"}, "sink": {"topic": f"{name}-out"},
                  "dead_letter": {"topic": f"{name}-dlq"}, "kafka": {"client": by_reference}}
        with worker.client() as client:
            shown = [orjson.dumps(client.create("c", config))]
            wait_for("every record committed", lambda: len(read_values(
                kafka_scram.bootstrap, f"{name}-out", client_config=admin.settings)) >= RECORDS, timeout_s=120)
            status = wait_for("c's group read with the worker's credentials",
                              lambda: (found := client.status("c"))["checkpoint"] is not None and found)
            shown += [orjson.dumps(answer) for answer in (status, client.get_config("c"), client.configs())]
        assert_exactly_once(kafka_scram.bootstrap, f"{name}-out", f"{name}-dlq", range(RECORDS),
                            client_config=admin.settings)
        assert worker.stop() == 0
        shown += [worker.log_path.read_bytes(), worker.task_logs().encode()]
        assert all(admin.password.encode() not in text for text in shown)
        assert f"${{env:{PASSWORD_VARIABLE}}}".encode() in shown[-3]
    finally:
        if worker is not None:
            worker.kill()
