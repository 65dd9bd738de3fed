"""Sample data for the schemas tests: rows covering every type of examples/schema-files/all_types.avsc."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from decimal import Decimal
from typing import Any

import pytest

from schemas import avro_format
from tests.helpers import EXAMPLES

ALL_TYPES_AVSC = EXAMPLES / "schema-files" / "all_types.avsc"
FIELDS_WITHOUT_JSON_FORM = ("by", "digest", "scores")  # bytes, fixed and map: Avro-only
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def all_types_rows(count: int, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` deterministic rows; every nullable field is null in some rows, extremes included."""
    rng = random.Random(seed)
    return [_row(n, rng) for n in range(count)]


def _row(n: int, rng: random.Random) -> dict[str, Any]:
    millis = rng.randrange(-10**12, 4 * 10**12)
    micros = rng.randrange(-10**15, 4 * 10**15)
    return {
        "b": n % 2 == 0,
        "i": rng.randrange(-2**31, 2**31),
        "l": rng.choice([-2**63, 2**63 - 1, rng.randrange(-2**63, 2**63)]),
        "f": rng.uniform(-1e6, 1e6),
        "d": rng.choice([rng.uniform(-1e300, 1e300), rng.random(), 0.1, -0.0]),
        "s": rng.choice(["", "plain", "quote\" backslash\\ newline\n tab\t", "ünïcødé ✓ 😀", f"row-{n}"]),
        "by": rng.randbytes(rng.randrange(0, 20)),
        "opt_s": None if n % 3 == 0 else f"opt-{n}",
        "opt_l": None if n % 4 == 0 else rng.randrange(-2**40, 2**40),
        "ts_ms": _EPOCH + dt.timedelta(milliseconds=millis),
        "ts_us": _EPOCH + dt.timedelta(microseconds=micros),
        "opt_ts": None if n % 5 == 0 else _EPOCH + dt.timedelta(milliseconds=millis + n),
        "local_ts": dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=micros),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=rng.randrange(-700_000, 700_000)),
        "t_ms": (dt.datetime(2000, 1, 1) + dt.timedelta(milliseconds=rng.randrange(86_400_000))).time(),
        "t_us": (dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=rng.randrange(86_400_000_000))).time(),
        "price": Decimal(rng.randrange(-10**10 + 1, 10**10)).scaleb(-2),
        "rate": Decimal(rng.randrange(-10**12 + 1, 10**12)).scaleb(-4),
        "opt_price": None if n % 2 else Decimal(rng.randrange(-10**9, 10**9)).scaleb(-2),
        "id": str(uuid.UUID(int=rng.getrandbits(128))),
        "color": rng.choice(["RED", "GREEN", "BLUE"]),
        "digest": rng.randbytes(4),
        "tags": [f"t{k}" for k in range(n % 4)],
        "scores": {f"k{k}": rng.random() for k in range(n % 3)},
        "address": None if n % 6 == 0 else {
            "street": f"{n} Main St", "zip": None if n % 7 == 0 else rng.randrange(10**5),
            "since": dt.date(2000, 1, 1) + dt.timedelta(days=n % 9000),
        },
        "visits": [{"at": _EPOCH + dt.timedelta(milliseconds=millis + k), "page": None if k % 2 else f"/p{k}"}
                   for k in range(n % 3)],
    }


def count_per_record_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the records the Avro formats read one by one with fastavro (not column-wise): ``[count]``."""
    count = [0]
    per_record = avro_format._schemaless_reader

    def counted(*args: Any) -> Any:
        count[0] += 1
        return per_record(*args)
    monkeypatch.setattr(avro_format, "_schemaless_reader", counted)
    return count
