#!/usr/bin/env bash
# The main job: the benchmark suite on this machine's default device for the current commit
# (or the asv range given), then the published history in html/.
#   bash bench.sh                 # HEAD
#   bash bench.sh main~5..main    # any asv run range
set -uo pipefail
cd "$(dirname "$0")"
source .ci/setup_env.sh
exec "$PY" -m verify_attn run "$@"
