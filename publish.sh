#!/usr/bin/env bash
# Publish results/ into html/ (asv publish + plots) and serve it on localhost: no GPU and
# no re-run needed. Extra arguments go to `python -m verify_attn.publish` (e.g. a port).
set -uo pipefail
cd "$(dirname "$0")"
source .ci/setup_env.sh
exec "$PY" -m verify_attn.publish --serve "$@"
