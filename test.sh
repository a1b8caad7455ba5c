#!/usr/bin/env bash
# The tests: correctness and behaviour on the CPU (and on CUDA where torch sees a GPU).
set -uo pipefail
cd "$(dirname "$0")"
source .ci/setup_env.sh
exec "$PY" -m pytest -q "$@"
