#!/usr/bin/env bash
# The README's first command: start the embedded local broker and prove transactions work on it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
BOOTSTRAP=$($BIN/epochline broker status >/dev/null 2>&1 && $BIN/epochline broker status | sed 's/.*bootstrap=//' || $BIN/epochline broker start)
echo "local broker: $BOOTSTRAP"
$BIN/python - "$BOOTSTRAP" <<'PY'
import sys, uuid
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": f"quickstart-{uuid.uuid4().hex}"})
producer.init_transactions(30)
print("transactional producer ready on", sys.argv[1])
PY
echo "stop the broker with: $BIN/epochline broker stop"
