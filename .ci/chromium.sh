#!/usr/bin/env bash
# Installs Debian's chromium for the browser tests of the worker's status page (tests/engine/worker/,
# through engine/testing/browser.py, which runs it headless with a throwaway profile).
# Idempotent: does nothing when `chromium` is on PATH. Runs unattended (no stdin).
set -euo pipefail

if command -v chromium >/dev/null; then
    echo "chromium: present: $(command -v chromium)"
    exit 0
fi

NAME=chromium
source "$(dirname "$0")/apt.sh"
apt_install chromium
command -v chromium >/dev/null || { echo "chromium: installed, but no chromium on PATH" >&2; exit 1; }
version=$(chromium --version 2>/dev/null) || { echo "chromium: installed, but \`chromium --version\` failed" >&2; exit 1; }
echo "chromium: installed $(command -v chromium): $version"
