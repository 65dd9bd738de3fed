#!/usr/bin/env bash
# The README's first command: start the embedded local Kafka broker, write 100k orders, run the
# exactly-once example connector (examples/orders-clean.yaml) to the end, and check its output.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
if ! $BIN/epochline broker status >/dev/null 2>&1; then
  $BIN/epochline broker start >/dev/null
fi
BOOTSTRAP=$($BIN/epochline broker status | sed 's/.*bootstrap=//')
echo "local broker at $BOOTSTRAP (stop it with: $BIN/epochline broker stop)"
$BIN/python examples/orders_demo.py --bootstrap "$BOOTSTRAP" --count "${COUNT:-100000}"
