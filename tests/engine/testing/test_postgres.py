"""The throwaway PostgreSQL of ``engine.testing.postgres``: a server the PostgreSQL sink can prepare on."""

from __future__ import annotations

import psycopg


def test_the_session_server_allows_prepared_transactions(postgres_dsn: str) -> None:
    with psycopg.connect(postgres_dsn) as connection:
        allowed = connection.execute("SHOW max_prepared_transactions").fetchone()
    assert allowed is not None and int(allowed[0]) >= 1
