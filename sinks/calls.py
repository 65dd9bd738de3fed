"""Running librdkafka's blocking transactional calls: retried by error class, bounded from outside."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaException

from sinks.errors import CallAbandoned, CallInterrupted, ProducerWedged, SinkError, classify

log = logging.getLogger(__name__)

T = TypeVar("T")
INTERRUPT_CHECK_S = 0.1
"""How often ``within_deadline`` asks whether a stop was requested while its call is in flight."""


def with_retries(call: Callable[[], T], what: str, deadline_s: float = 120.0,
                 interrupted: Callable[[], bool] = lambda: False) -> T:
    """Run a transactional API call, retrying only what librdkafka calls retriable, up to a deadline; a stop
    requested meanwhile (``interrupted``) ends the retries with ``CallInterrupted``."""
    deadline = time.monotonic() + deadline_s
    backoff = 0.1
    while True:
        try:
            return call()
        except KafkaException as exc:
            failure = classify(exc.args[0], what)
            if failure is not None:
                raise failure from exc
            if interrupted():
                raise CallInterrupted(f"{what}: stop requested while retrying ({exc.args[0].str()})") from exc
            if time.monotonic() > deadline:
                raise SinkError(f"{what}: still failing after {deadline_s:.0f}s: {exc.args[0].str()}") from exc
            log.warning("retrying transactional call", extra={"call": what, "error": exc.args[0].str()})
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


def within_deadline(call: Callable[[], T], what: str, deadline_s: float,
                    interrupted: Callable[[], bool] = lambda: False) -> T:
    """Run a blocking librdkafka call on a helper thread and give up on it after ``deadline_s``, or as soon as
    a stop is requested (``interrupted``).

    Why: ``send_offsets_to_transaction`` can block past its own timeout when the group coordinator
    restarts (librdkafka issues #5456, #5511), and when the transaction coordinator is gone it waits out its
    request timeout (``socket.timeout.ms``) whatever timeout it was given. A call that never returns would freeze the
    connector with its transaction open, holding back every read_committed reader. Giving up raises
    ``ProducerWedged``: the connector then restarts from the last committed checkpoint with a new producer,
    whose ``init_transactions`` fences the wedged one. A stop requested meanwhile raises ``CallAbandoned``:
    the process stops at once instead of after the call, and the next start fences the producer the same way.
    """
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = error

    worker = threading.Thread(target=run, name=f"epochline-{what}", daemon=True)
    worker.start()
    deadline = time.monotonic() + deadline_s
    while worker.is_alive() and time.monotonic() < deadline:
        worker.join(min(INTERRUPT_CHECK_S, max(0.0, deadline - time.monotonic())))
        if worker.is_alive() and interrupted():
            raise CallAbandoned(f"{what}: stop requested while the call was in flight; the producer is abandoned")
    if worker.is_alive():
        raise ProducerWedged(f"{what} did not return within {deadline_s:.0f}s; restarting with a new producer")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")  # type: ignore[return-value]
