#!/bin/bash
# On the GPU machine: pack.sh's parts unpacked into DIR/site, to put on PYTHONPATH beside the
# image's torch. A call's tree keeps only what that call carries, so a part carried by an earlier
# call is first stashed outside the tree (`--stash`) and taken back from there.
#   call 1..K-1:  scripts/offline_cuda/unpack.sh --stash DIR      (carrying DIR/partK)
#   call K:       scripts/offline_cuda/unpack.sh DIR && PYTHONPATH=$PWD/DIR/site python3 ...
set -uo pipefail
STASH=${PARTS_STASH:-$HOME/.dlrm-scale-parts}
if [ "${1:-}" = --stash ]; then
  [ -d "${2:-}" ] || { echo "error: give the folder holding this call's part: unpack.sh --stash DIR" >&2; exit 2; }
  mkdir -p "$STASH" && cp "$2"/part? "$STASH"/ && echo "stashed: $(cd "$STASH" && ls part? | tr '\n' ' ')"
  exit
fi
[ -d "${1:-}" ] || { echo "error: give the folder pack.sh filled and this call carried: unpack.sh DIR" >&2; exit 2; }
DIR=$1
for part in "$STASH"/part?; do  # what earlier calls stashed, unless this call carried it again
  [ -f "$part" ] && [ ! -f "$DIR/$(basename "$part")" ] && cp "$part" "$DIR"/
done
SITE=$(cd "$DIR" && pwd)/site
rm -rf "$SITE" "$DIR/bundle" && mkdir -p "$SITE" "$DIR/bundle"
cat "$DIR"/part? 2>/dev/null | tar xf - -C "$DIR/bundle" 2>/dev/null || { echo "error: the parts in $DIR (and $STASH) do not make a whole bundle: carry or stash every part" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$DIR"/bundle/zstandard-*.whl 2>&1 | grep -v "as the 'root' user"
unzstd() {  # the image has no zstd program
  PYTHONPATH=$SITE python3 -c "import sys, zstandard
zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"
}
unzstd < "$DIR/bundle/fbgemm.tar.zst" | tar xf - -C "$SITE" && unzstd < "$DIR/bundle/ortools.tar.zst" | tar xf - -C "$SITE" || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$DIR"/bundle/*.whl 2>&1 | grep -v -E "as the 'root' user|already exists"
PYTHONPATH=$SITE python3 -c "import torch, fbgemm_gpu, torchrec, ortools
print('torch', torch.__version__, 'fbgemm_gpu', fbgemm_gpu.__version__, 'ortools', ortools.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" 2>&1 | grep -v -E "_fbgemm_torch_compat_table|cannot determine compatibility|^\s*$"
exit "${PIPESTATUS[0]}"
