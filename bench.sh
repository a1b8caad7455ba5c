#!/usr/bin/env bash
# The main job: the benchmark suite on this machine's default device for the current commit
# (or the asv range given as arguments), then the published history in html/.
#   bash bench.sh                 # HEAD
#   bash bench.sh main~5..main    # any asv run range
set -uo pipefail
cd "$(dirname "$0")"
source .ci/setup_env.sh
machine=$("$PY" -m verify_attn.machine) || exit 1
asv_machine "$machine" || exit 1

# asv shows a benchmark's output only when it ends; follow the suite's own progress meanwhile.
log=${VERIFY_ATTN_CACHE:-$HOME/.cache/verify_attn}/progress.log
mkdir -p "$(dirname "$log")" && : > "$log"
tail -n 0 -f "$log" & follower=$!
trap 'kill $follower 2>/dev/null' EXIT

"$PY" -m asv run --machine "$machine" --record-samples "${@:-HEAD^!}"
status=$?
"$PY" -m verify_attn.publish || status=1
exit $status
