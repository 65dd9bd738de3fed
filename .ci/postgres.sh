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

as_root=()
if [[ $EUID -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "postgresql: must run as root (or with sudo) to apt-get install" >&2; exit 1; }
    as_root=(sudo -n)
fi

policy=/usr/sbin/policy-rc.d
if [[ ! -e $policy ]]; then
    "${as_root[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $policy && chmod 755 $policy"
    trap '"${as_root[@]}" rm -f "$policy"' EXIT
fi

"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql </dev/null
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || { echo "postgresql: installed, but no initdb found" >&2; exit 1; }
echo "postgresql: installed $(compgen -G '/usr/lib/postgresql/*/bin/initdb' | tr '\n' ' ')"
