"""A worker cluster runs connectors deployed over REST, exactly once, against the real broker.

Every test starts real ``epochline worker`` processes (each running its tasks as child processes), deploys
connectors through the API, changes, pauses, kills and restarts things while the input streams in, and reads
the output and dead letters with ``read_committed``: every input id exactly once (or exactly twice after an
offset reset), none dead-lettered.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from connectors.admin import create_topic
from engine.cli import main
from engine.testing import LocalWorker, read_values
from engine.testing.accounting import assert_exactly_once
from engine.testing.browser import render_page, visible_text
from engine.testing.connectors import LiveInput, produce_values
from engine.worker.client import WorkerApiError
from tests.helpers.transforms import FAIL_FLAG_ENV
from tests.helpers.worker_process import start_worker, wait_for

SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
PARTITIONS = 4


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, str, list[LocalWorker]]]:
    """A fresh cluster name and the workers a test started, each stopped by its PID afterwards."""
    workers: list[LocalWorker] = []
    yield tmp_path, f"cluster-{uuid.uuid4().hex[:8]}", workers
    for worker in workers:
        worker.kill()


def topics(bootstrap: str, prefix: str, partitions: int = PARTITIONS) -> tuple[str, str, str]:
    names = (f"{prefix}-in", f"{prefix}-out", f"{prefix}-dlq")
    for name in names:
        create_topic(bootstrap, name, partitions=partitions)
    return names


def connector_config(source: str, sink: str, dead_letter: str, sql: str = "SELECT id FROM input",
                     **extra: Any) -> dict[str, Any]:
    return {"source": {"topic": source, "format": "json", "schema": SCHEMA}, "transform": {"sql": sql},
            "sink": {"topic": sink}, "dead_letter": {"topic": dead_letter}, **extra}


def ids(count: int, start: int = 0) -> list[bytes]:
    return [orjson.dumps({"id": i}) for i in range(start, start + count)]


def output(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    return [orjson.loads(value) for value in read_values(bootstrap, topic) if value is not None]


def wait_for_output(bootstrap: str, topic: str, count: int, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    return wait_for(f"{count} records in {topic}", lambda: (rows if len(rows := output(bootstrap, topic)) >= count
                                                            else None), timeout_s, every_s=1.0)


def task_states(worker: LocalWorker, name: str) -> dict[str, dict[str, Any]]:
    with worker.client() as client:
        return {task["worker_id"]: task for task in client.status(name)["tasks"]}


def running_task(worker: LocalWorker, name: str, on: str) -> dict[str, Any] | None:
    task = task_states(worker, name).get(on)
    return task if task is not None and task["state"] == "RUNNING" and task["pid"] else None


def test_a_connector_deployed_over_rest_switches_sql_mid_stream_exactly_once_and_its_neighbour_never_restarts(
        kafka_bootstrap: str, cluster: tuple[Path, str, list[LocalWorker]]) -> None:
    directory, name, workers = cluster
    worker = start_worker(directory, kafka_bootstrap, name, "w1")
    workers.append(worker)
    source, sink, dead_letter = topics(kafka_bootstrap, f"{name}-a")
    other_source, other_sink, other_dead_letter = topics(kafka_bootstrap, f"{name}-b", partitions=1)
    records = 20_000
    live = LiveInput(kafka_bootstrap, source, ids(records), PARTITIONS, seconds=12)
    version_sql = ("SELECT id, '{}' AS version, __kafka_partition AS p, __kafka_offset AS o FROM input")
    warm = wait_for("the worker's warm task process", worker.warm_task_pid)
    with worker.client() as client:
        client.create("a", connector_config(source, sink, dead_letter, version_sql.format("v1")))
        first = wait_for("a running", lambda: running_task(worker, "a", "w1"))
        assert first["pid"] == warm, "the first task did not start in the process the worker made ahead"
        client.create("b", connector_config(other_source, other_sink, other_dead_letter))
        produce_values(kafka_bootstrap, other_source, ids(100), 1)
        neighbour = wait_for("b running", lambda: running_task(worker, "b", "w1"))
        wait_for("a's first committed epoch", lambda: client.status("a")["checkpoint"])
        created, _ = client.put_config("a", connector_config(source, sink, dead_letter, version_sql.format("v2")))
        assert not created
        live.join()
        rows = wait_for_output(kafka_bootstrap, sink, records)
        assert_exactly_once(kafka_bootstrap, sink, dead_letter, range(records))
        by_partition: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for row in rows:
            by_partition[row["p"]].append((row["o"], row["version"]))
        for partition, produced in by_partition.items():
            versions = [version for _, version in sorted(produced)]
            assert versions == sorted(versions), f"input partition {partition}: a v1 row after a v2 row"
        assert {row["version"] for row in rows} == {"v1", "v2"}
        assert len(output(kafka_bootstrap, other_sink)) == 100
        after = task_states(worker, "b")["w1"]
        assert (after["pid"], after["restarts"]) == (neighbour["pid"], 0), "the neighbour was restarted"
        assert task_states(worker, "a")["w1"]["restarts"] == 0, "the update counted as a failure"
    assert worker.stop() == 0
    workers.remove(worker)
    stopped = [line for line in worker.task_logs().splitlines() if '"connector stopped"' in line]
    assert len(stopped) == 3, "a SIGTERM to the worker stops every task cleanly (a's first task, a, b)"


def test_two_workers_share_a_connector_and_a_worker_killed_repeatedly_loses_and_repeats_nothing(
        kafka_bootstrap: str, cluster: tuple[Path, str, list[LocalWorker]]) -> None:
    directory, name, workers = cluster
    first = start_worker(directory, kafka_bootstrap, name, "w1")
    second = start_worker(directory, kafka_bootstrap, name, "w2")
    workers += [first, second]
    source, sink, dead_letter = topics(kafka_bootstrap, f"{name}-c")
    records = 30_000
    live = LiveInput(kafka_bootstrap, source, ids(records), PARTITIONS, seconds=25)
    with first.client() as client:
        client.create("c", connector_config(source, sink, dead_letter))
    for _ in range(2):
        wait_for("both workers running c", lambda: running_task(first, "c", "w1") and running_task(first, "c", "w2"))
        wait_for("w2 holding partitions", lambda: (task_states(first, "c").get("w2") or {}).get("partitions"))
        second.kill()
        workers.remove(second)
        moved = wait_for("w1 holding every partition after w2 died",
                         lambda: len((task_states(first, "c").get("w1") or {}).get("partitions") or []) == PARTITIONS
                         and "w2" not in task_states(first, "c"), timeout_s=60)
        assert moved
        second = start_worker(directory, kafka_bootstrap, name, "w2", port=second.port)
        workers.append(second)
    live.join()
    wait_for_output(kafka_bootstrap, sink, records)
    assert_exactly_once(kafka_bootstrap, sink, dead_letter, range(records))


def test_pause_resume_stop_offset_reset_and_a_failing_task_that_restart_brings_back(
        kafka_bootstrap: str, cluster: tuple[Path, str, list[LocalWorker]], tmp_path: Path) -> None:
    directory, name, workers = cluster
    flag = tmp_path / "fail-flag"
    worker = start_worker(directory, kafka_bootstrap, name, "w1", extra_args=("--max-task-failures", "2"),
                          env={FAIL_FLAG_ENV: str(flag)})
    workers.append(worker)
    source, sink, dead_letter = topics(kafka_bootstrap, f"{name}-d", partitions=2)
    produce_values(kafka_bootstrap, source, ids(1000), 2)
    with worker.client() as client:
        client.create("d", connector_config(source, sink, dead_letter))
        wait_for_output(kafka_bootstrap, sink, 1000)

        client.pause("d")
        wait_for("d paused", lambda: client.status("d")["connector"]["state"] == "PAUSED"
                 and task_states(worker, "d")["w1"]["state"] == "PAUSED")
        produce_values(kafka_bootstrap, source, ids(500, start=1000), 2)
        with pytest.raises(AssertionError):
            wait_for_output(kafka_bootstrap, sink, 1001, timeout_s=4)
        client.resume("d")
        wait_for_output(kafka_bootstrap, sink, 1500)

        with pytest.raises(WorkerApiError) as refused:
            client.reset_offsets("d")
        assert refused.value.status_code == 409
        client.stop("d")
        wait_for("d stopped", lambda: task_states(worker, "d")["w1"]["state"] == "STOPPED")
        client.reset_offsets("d")
        client.resume("d")
        wait_for_output(kafka_bootstrap, sink, 3000)
        assert_exactly_once(kafka_bootstrap, sink, dead_letter, Counter({i: 2 for i in range(1500)}))

        flag.touch()
        failing_source, failing_sink, failing_dead_letter = topics(kafka_bootstrap, f"{name}-e", partitions=1)
        produce_values(kafka_bootstrap, failing_source, ids(10), 1)
        failing = connector_config(failing_source, failing_sink, failing_dead_letter)
        failing["transform"] = {"python": "tests.helpers.transforms:fail_while_flagged"}
        client.create("e", failing)
        failed = wait_for("e failed", lambda: (status := client.status("e"))["connector"]["state"] == "FAILED"
                          and status, timeout_s=90)
        [task] = failed["tasks"]
        assert task["state"] == "FAILED" and task["restarts"] == 2
        assert "failing on purpose" in task["error"]["message"]
        assert "RuntimeError: failing on purpose" in task["trace"]
        flag.unlink()
        client.restart("e")
        wait_for_output(kafka_bootstrap, failing_sink, 10, timeout_s=60)
        assert client.status("e")["connector"]["state"] == "RUNNING"

        page = visible_text(render_page(f"{worker.url}/ui"))
        for connector in ("d", "e"):
            assert f"{connector} RUNNING" in page, page


def test_the_api_reports_bad_configs_per_field_and_bad_requests_by_reason(
        kafka_bootstrap: str, cluster: tuple[Path, str, list[LocalWorker]]) -> None:
    directory, name, workers = cluster
    worker = start_worker(directory, kafka_bootstrap, name, "w1")
    workers.append(worker)
    config = connector_config("in", "out", "dlq", sql="SELECT no_such_column FROM input")
    config["source"]["bogus"] = 1
    with worker.client() as client:
        report = client.validate(config)
        fields = {entry["value"]["name"]: entry["value"]["errors"] for entry in report["configs"]}
        assert set(fields) == {"source.bogus"} and report["error_count"] == 1
        del config["source"]["bogus"]
        fields = {entry["value"]["name"]: entry["value"]["errors"] for entry in client.validate(config)["configs"]}
        assert list(fields) == ["transform.0.sql"] and "no_such_column" in fields["transform.0.sql"][0]
        with pytest.raises(WorkerApiError) as missing:
            client.status("nope")
        assert missing.value.status_code == 404
        with pytest.raises(WorkerApiError) as invalid:
            client.create("x", config)
        assert invalid.value.status_code == 400 and "transform.0.sql" in str(invalid.value)
    schemaless = {**config, "source": {"topic": "in", "format": "json"}, "transform": {"sql": "SELEC 1"}}
    big = connector_config("in", "out", "dlq")
    big["source"]["consumer"] = {"client.rack": "x" * 1_040_000}  # a body under 1 MiB, a record over 1,000,000 bytes
    yaml_body = {"content-type": "application/yaml"}
    bomb = "\n".join(['name: bomb', 'config: {source: {topic: in, schema: {l0: &l0 ["lol", "lol", "lol"]}}}',
                      *(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, 12))])
    refusals = [(httpx.put(f"{worker.url}/connectors/r9/config", json=schemaless), "transform.0.sql"),
                (httpx.put(f"{worker.url}/connectors/{'n' * 300}/config", json=config), "too long"),
                (httpx.post(f"{worker.url}/connectors", content=bomb, headers=yaml_body), "aliases"),
                (httpx.put(f"{worker.url}/connectors/big/config", json=big, timeout=30), "bytes is larger than")]
    for response, words in refusals:
        assert response.status_code == 400 and words in response.json()["message"], response.text
    assert refusals[2][0].elapsed.total_seconds() < 1.0  # the bomb: refused before anything expands it
    with worker.client() as client:
        assert client.list() == []


def test_a_worker_needs_a_token_off_loopback_never_shows_a_configured_password_and_deletes_it_from_disk(
        kafka_bootstrap: str, cluster: tuple[Path, str, list[LocalWorker]], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    directory, name, workers = cluster
    monkeypatch.delenv("EPOCHLINE_API_TOKEN", raising=False)
    assert main(["worker", "--cluster", name, "--rest", "0.0.0.0:0", "--bootstrap-servers", kafka_bootstrap,
                 "--state-dir", str(directory / "refused")]) == 2
    assert "without a token" in capsys.readouterr().err
    token, password = "t0ken-" + uuid.uuid4().hex, "pw-" + uuid.uuid4().hex
    worker = start_worker(directory, kafka_bootstrap, name, "w1", token=token)
    workers.append(worker)
    source, sink, dead_letter = topics(kafka_bootstrap, f"{name}-s", partitions=1)
    produce_values(kafka_bootstrap, source, ids(10), 1)
    anonymous = LocalWorker(worker.name, worker.port, worker.state_dir, worker.log_path, worker.process)
    with anonymous.client() as client, pytest.raises(WorkerApiError) as unauthorized:
        client.list()
    assert unauthorized.value.status_code == 401
    config = connector_config(source, sink, dead_letter, kafka={"client": {"sasl.password": password}})
    with worker.client() as client:
        shown = [orjson.dumps(client.create("s", config))]
        wait_for_output(kafka_bootstrap, sink, 10)
        shown += [orjson.dumps(answer) for answer in (client.get_config("s"), client.status("s"), client.configs(),
                                                      client.statuses(), client.info())]

    shown.append(httpx.get(f"{worker.url}/metrics", headers={"Authorization": f"Bearer {token}"}).content)
    shown.append(worker.task_logs().encode())
    task_files = worker.state_dir / "connectors" / "s"
    assert password in (task_files / "config" / "config.yaml").read_text()  # at rest while the connector exists
    with worker.client() as client:
        client.delete("s")
    wait_for("the deleted connector's files removed", lambda: not task_files.exists() or None, timeout_s=60.0)
    assert list((worker.state_dir / "connectors").iterdir()) == []
    worker.stop()
    workers.remove(worker)
    shown.append(worker.log_path.read_bytes())
    assert all(password.encode() not in text for text in shown)
    assert b"[redacted]" in shown[1]


def test_connectors_apply_makes_a_folder_of_yaml_files_the_running_set(
        kafka_bootstrap: str, cluster: tuple[Path, str, list[LocalWorker]], capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    directory, name, workers = cluster
    worker = start_worker(directory, kafka_bootstrap, name, "w1")
    workers.append(worker)
    folder = tmp_path / "connectors"
    folder.mkdir()
    (folder / "ids.schema.json").write_bytes(orjson.dumps(SCHEMA))
    sinks = {}
    for connector in ("f", "g"):
        source, sinks[connector], dead_letter = topics(kafka_bootstrap, f"{name}-{connector}", partitions=1)
        produce_values(kafka_bootstrap, source, ids(50), 1)
        config = {**connector_config(source, sinks[connector], dead_letter), "name": connector}
        config["source"]["schema"] = "ids.schema.json"
        (folder / f"{connector}.yaml").write_text(yaml.safe_dump(config))
    apply = ["connectors", "apply", str(folder), "--url", worker.url]
    assert main(apply) == 0
    assert capsys.readouterr().out.splitlines() == ["created f", "created g"]
    for connector in ("f", "g"):
        wait_for_output(kafka_bootstrap, sinks[connector], 50)
    assert wait_for("healthy", lambda: httpx.get(f"{worker.url}/health").status_code == 200)
    metrics = httpx.get(f"{worker.url}/metrics").text
    assert 'epochline_records_out_total{connector="f",worker="w1"} 50.0' in metrics

    changed = yaml.safe_load((folder / "f.yaml").read_text())
    changed["transform"] = {"sql": "SELECT id, 1 AS one FROM input"}
    (folder / "f.yaml").write_text(yaml.safe_dump(changed))
    (folder / "g.yaml").unlink()
    assert main([*apply, "--prune", "--dry-run"]) == 0
    dry_run = capsys.readouterr().out
    assert "update f (restarts)" in dry_run and "delete g" in dry_run and "+  sql: SELECT id, 1 AS one" in dry_run
    assert main([*apply, "--prune"]) == 0
    assert capsys.readouterr().out.splitlines() == ["updated f (restarting)", "deleted g"]
    with worker.client() as client:
        assert client.list() == ["f"]
        assert wait_for("g's task stopped and forgotten",
                        lambda: 'connector="g"' not in httpx.get(f"{worker.url}/metrics").text)
        assert set(client.statuses()) == {"f"}
