#!/usr/bin/env bash
# Builds fastio.c into a Python extension beside it, for the interpreter given (default: python3).
set -euo pipefail
python=${1:-python3}
here=$(cd "$(dirname "$0")" && pwd)
include=$("$python" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
suffix=$("$python" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
gcc -O2 -Wall -shared -fPIC -I"$include" "$here/fastio.c" -o "$here/fastio$suffix" -ldl
echo "$here/fastio$suffix"
