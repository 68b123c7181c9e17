#!/bin/bash
# On the GPU machine, once pack.sh's parts are there (unpack.sh): the stack unpacked beside the
# image's torch, then scripts/gpu_check.py with the given flags; RESULTS (default out) gets its
# gpu_check.json and gpu_check_logs.tar.gz. CHECK_S bounds the check, so the results are copied in time.
#   scripts/offline_cuda/check.sh DIR [--steps 100 ...]
set -uo pipefail
[ $# -ge 1 ] && [ -d "$1" ] || { echo "error: give the folder pack.sh filled and the calls carried: scripts/offline_cuda/check.sh DIR [gpu_check flags]" >&2; exit 2; }
DIR=$1; shift
RESULTS=${RESULTS:-out}
export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/unpack.sh" "$DIR" || exit
export PYTHONPATH=$(cd "$DIR" && pwd)/site
quiet() { grep -v -E "^\s*$|_fbgemm_torch_compat_table|cannot determine compatibility|^\s*.\[[0-9]+m|^WARNING:root:$"; }
timeout "${CHECK_S:-540}" python3 scripts/gpu_check.py --out out/gpu_check "$@" 2>&1 | quiet
code=${PIPESTATUS[0]}
mkdir -p "$RESULTS"
cp out/gpu_check/gpu_check.json "$RESULTS"/ 2>/dev/null
tar czf "$RESULTS"/gpu_check_logs.tar.gz --exclude='ckpt*' -C out gpu_check
exit "$code"
