#!/bin/bash
# The CUDA stack for a GPU machine that cannot reach a package index, packed here in parts that
# each fit one transfer beside the repository. Made for this workplace's lent H200 (python 3.12,
# torch 2.11+cu130, no FBGEMM, TorchRec or OR-Tools there; 64 MiB a call, repository included):
# FBGEMM 1.6.0 (the release built for torch 2.11; 1.8.0 needs 2.13) cut to sm_90 cubins
# (fatbin.py), TorchRec 1.6.1, OR-Tools, and what they import that the image lacks.
#   scripts/offline_cuda/pack.sh [DIR=.gpu]     # about 7 minutes on 2 cores: DIR/part0, DIR/part1, ...
#   then carry DIR/partK in call K (DIR ignored by git): `unpack.sh --stash DIR` in each call but the
#   last, and in the last scripts/offline_cuda/check.sh DIR (a call keeps only what it carries)
set -euo pipefail
DIR=${1:-.gpu}
# what it needs and what it replaces, said before the long work: DIR is emptied, so it may hold only parts
for tool in zstd unzip git; do
  command -v $tool >/dev/null || { echo "error: pack.sh needs $tool: install it" >&2; exit 2; }
done
if [ -e "$DIR" ] && find "$DIR" -mindepth 1 -maxdepth 1 ! -name 'part?' ! -name site ! -name bundle | grep -q .; then
  echo "error: $DIR holds other files, and pack.sh empties it: give a new or a parts-only folder" >&2; exit 2
fi
PY=3.12 SM=90 FBGEMM=1.6.0 TORCHREC=1.6.1 ORTOOLS=9.15.6755
CALL_BYTES=$((64 * 1024 * 1024))
ROOT=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version $PY --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$work/wheels" "$@"
}
# the image has protobuf 7 (OR-Tools 9.15 is generated for 6.33) and none of the others
download fbgemm-gpu==$FBGEMM torchrec==$TORCHREC ortools==$ORTOOLS "protobuf>=6.33.1,<6.34" \
  tensordict==0.15.3 "pyvers>=0.2,<0.3" immutabledict torchmetrics==1.0.3 zstandard
mkdir -p "$work/bundle" "$work/fbgemm" "$work/ortools"
(cd "$work/fbgemm" && unzip -q "$work"/wheels/fbgemm_gpu-*.whl && rm "$work"/wheels/fbgemm_gpu-*.whl)
python3 "$ROOT/scripts/offline_cuda/fatbin.py" --keep-sm $SM "$work/fbgemm"
# a 1 GiB window finds the repeats between the libraries' cubins: 62 MiB where -19 gives 94
tar cf - -C "$work/fbgemm" . | zstd -T0 --ultra -22 --long=30 -q > "$work/bundle/fbgemm.tar.zst"
(cd "$work/ortools" && unzip -q "$work"/wheels/ortools-*.whl && rm "$work"/wheels/ortools-*.whl)
tar cf - -C "$work/ortools" . | zstd -T0 -19 --long=27 -q > "$work/bundle/ortools.tar.zst"
mv "$work"/wheels/*.whl "$work/bundle/"
python3 -m pip download -q --no-deps --no-binary=:all: -d "$work/sdist" iopath==0.1.10  # an sdist only, pure Python
python3 -m pip wheel -q --no-deps -w "$work/bundle" "$work"/sdist/iopath-*
# each part rides with the repository (tracked and untracked files that are not ignored)
repo_bytes=$(cd "$ROOT" && { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
part_bytes=$((CALL_BYTES - repo_bytes - 1024 * 1024))
rm -rf "$DIR" && mkdir -p "$DIR"
tar cf "$work/bundle.tar" -C "$work/bundle" .
split -b $part_bytes -d -a 1 "$work/bundle.tar" "$DIR/part"
ls -l "$DIR"
echo "carry $DIR/part0 .. in successive calls (each call keeps what earlier ones left while the machine stays warm)"
