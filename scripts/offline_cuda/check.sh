#!/bin/bash
# On the GPU machine, once pack.sh's parts are there: the stack unpacked beside the image's torch,
# then scripts/gpu_check.py with the given flags; RESULTS (default out) gets its
# gpu_check.json and gpu_check_logs.tar.gz. CHECK_S bounds the check, so the results are copied in time.
#   scripts/offline_cuda/check.sh DIR [--steps 100 ...]
set -uo pipefail
[ $# -ge 1 ] && [ -d "$1" ] || { echo "error: give the folder pack.sh filled and the calls carried: scripts/offline_cuda/check.sh DIR [gpu_check flags]" >&2; exit 2; }
DIR=$1; shift
SITE=$(cd "$DIR" && pwd)/site RESULTS=${RESULTS:-out}
export PYTHONUNBUFFERED=1
rm -rf "$SITE" "$DIR/bundle" && mkdir -p "$SITE" "$DIR/bundle"
cat "$DIR"/part? 2>/dev/null | tar xf - -C "$DIR/bundle" 2>/dev/null || { echo "error: the parts in $DIR do not make a whole bundle: carry every part" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$DIR"/bundle/zstandard-*.whl 2>&1 | grep -v "as the 'root' user"
unzstd() {  # the image has no zstd program
  PYTHONPATH=$SITE python3 -c "import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"
}
unzstd < "$DIR/bundle/fbgemm.tar.zst" | tar xf - -C "$SITE" && unzstd < "$DIR/bundle/ortools.tar.zst" | tar xf - -C "$SITE" || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$DIR"/bundle/*.whl 2>&1 | grep -v "as the 'root' user"
export PYTHONPATH=$SITE
quiet() { grep -v -E "^\s*$|_fbgemm_torch_compat_table|cannot determine compatibility|^\s*.\[[0-9]+m|^WARNING:root:$"; }
python3 -c "import torch, fbgemm_gpu, torchrec, ortools
print('torch', torch.__version__, 'fbgemm_gpu', fbgemm_gpu.__version__, 'ortools', ortools.__version__, torch.cuda.get_device_name(0))" 2>&1 | quiet
timeout "${CHECK_S:-540}" python3 scripts/gpu_check.py --out out/gpu_check "$@" 2>&1 | quiet
code=${PIPESTATUS[0]}
mkdir -p "$RESULTS"
cp out/gpu_check/gpu_check.json "$RESULTS"/ 2>/dev/null
tar czf "$RESULTS"/gpu_check_logs.tar.gz --exclude='ckpt*' -C out gpu_check
exit "$code"
