#!/usr/bin/env bash
# Installs Debian's PostgreSQL server binaries for the PostgreSQL half of tests/test_batch_store.py.
# Idempotent: does nothing when /usr/lib/postgresql/<version>/bin/initdb exists. Runs unattended (no stdin).
# It only installs: the tests start their own throwaway cluster on 127.0.0.1 (tests/postgres_server.py), so
# the package's default cluster is kept from starting (policy-rc.d) and no server is left running.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    echo "postgresql: server binaries present: $(compgen -G '/usr/lib/postgresql/*/bin/initdb' | tr '\n' ' ')"
    exit 0
fi

NAME=postgresql
source "$(dirname "$0")/apt.sh"

policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    "${as_root[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    trap '"${as_root[@]}" rm -f "$policy"' EXIT
fi

apt_install postgresql
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || { echo "postgresql: installed, but no initdb found" >&2; exit 1; }
echo "postgresql: installed $(compgen -G '/usr/lib/postgresql/*/bin/initdb' | tr '\n' ' ')"
