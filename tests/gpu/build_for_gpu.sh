#!/usr/bin/env bash
# Prepares, on a CPU machine with nvcc and Triton, the native library that the one verification run of
# tests/gpu/verify.py carries to a GPU machine: CUDA kernels for sm_80 and sm_90 and the Triton cubins embedded
# (lsh_cumulation and lower_bound_gradients then run the Triton kernels on sm_80 / sm_90 GPUs), no TensorFlow op
# library. Then prints the paths to carry and the command to run there.
#
#   PYTHON=/work/venv/bin/python bash tests/gpu/build_for_gpu.sh [--only REGEX] [--cubins DIR] [--out-dir DIR]
#
# 1. The AOT build of the Triton kernels (custom_ops/triton/aot.py, ~5 min on 2 cores) into --cubins DIR
#    (default build/triton_cubins), skipped when DIR was built from the same custom_ops/triton/*.py (the
#    manifest's sources digest), its cubins match the C++ variant rows (embed.py's stale_reasons) and DIR was
#    built with the same --only. It builds into DIR.partial and replaces DIR only when aot.py's checks pass.
# 2. The native library with those cubins embedded (setup.py build_ext with KERAS_YOSO_TRITON_CUBINS=DIR,
#    KERAS_YOSO_CUDA_ARCHS, KERAS_YOSO_BUILD_TF_OPS=0; nvcc ~2-4 min) in a folder of its own under build/, then
#    moved into --out-dir DIR (default keras_yoso, where verify.py loads it) in one rename, replacing the
#    keras_yoso/_yoso_native*.so there; nothing in --out-dir changes when a step fails.
# 3. ky_triton_cubins() of the new library (it must be > 0), the paths to pass to the device tool's `carry` (the
#    library is ignored by git, so the tool carries it only when named; .whl/ from tests/gpu/carry_wheels.sh
#    holds keras, which the GPU image lacks) and the command.
#
# --only REGEX: build only the Triton variants whose name matches (aot.py --only): a quick check of this script,
#   whose library runs the Triton kernels only where those variants cover the call. Use it with --cubins and
#   --out-dir outside the package for such a check.
# PYTHON: the interpreter with Triton, setuptools and jaxlib (its XLA FFI headers) (default python3).
# KERAS_YOSO_CUDA_ARCHS: the CUDA kernels' architectures (default "80;90", those of the GPU machines lent).
# DEADLINE: verify.py's --deadline in seconds in the printed command (default 400; its timeout is 20 s more).
set -euo pipefail

PYTHON=${PYTHON:-python3}
ARCHS=${KERAS_YOSO_CUDA_ARCHS:-80;90}
DEADLINE=${DEADLINE:-400}
ONLY=""
CUBINS=build/triton_cubins
OUT_DIR=keras_yoso

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

while [[ $# -gt 0 ]]; do
  case $1 in
    --only) ONLY=${2:?--only needs a regex}; shift 2 ;;
    --cubins) CUBINS=${2:?--cubins needs a folder}; shift 2 ;;
    --out-dir) OUT_DIR=${2:?--out-dir needs a folder}; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "build_for_gpu.sh: unknown argument $1" >&2; usage ;;
  esac
done

cd "$(git rev-parse --show-toplevel)"
say() { echo "build_for_gpu.sh: $*"; }

# 1. The Triton cubins.
stamp="$CUBINS/build_for_gpu.only"
fresh=false
if [[ -f $CUBINS/manifest.json && -f $stamp && "$(cat "$stamp")" == "$ONLY" ]] &&
  "$PYTHON" -c 'import json, sys; sys.path.insert(0, "custom_ops/triton"); import embed
sys.exit(1 if embed.stale_reasons(json.load(open(sys.argv[1]))) else 0)' "$CUBINS/manifest.json"; then
  fresh=true
fi
if $fresh; then
  say "the Triton cubins in $CUBINS were built from these sources and match the variant rows: kept"
else
  say "AOT build of the Triton kernels into $CUBINS${ONLY:+ (only $ONLY)}"
  rm -rf "$CUBINS.partial"
  started=$SECONDS
  "$PYTHON" custom_ops/triton/aot.py --out "$CUBINS.partial" ${ONLY:+--only "$ONLY"}
  printf '%s' "$ONLY" >"$CUBINS.partial/build_for_gpu.only"
  rm -rf "$CUBINS"
  mv "$CUBINS.partial" "$CUBINS"
  say "built $(ls "$CUBINS"/*.cubin | wc -l) cubins in $((SECONDS - started)) s"
fi

# 2. The native library, built aside, then moved into OUT_DIR.
mkdir -p build "$OUT_DIR"
work=$(mktemp -d "$PWD/build/gpu_library.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS
KERAS_YOSO_TRITON_CUBINS=$(cd "$CUBINS" && pwd) KERAS_YOSO_CUDA_ARCHS=$ARCHS KERAS_YOSO_BUILD_TF_OPS=0 \
  "$PYTHON" setup.py -q build_ext --build-lib "$work/lib" --build-temp "$work/temp"
built=("$work"/lib/keras_yoso/_yoso_native*.so)
if [[ ! -f ${built[0]} ]]; then
  say "setup.py built no keras_yoso/_yoso_native*.so" >&2
  exit 1
fi
name=$(basename "${built[0]}")
cubins=$("$PYTHON" -c 'import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).ky_triton_cubins())' "${built[0]}")
if [[ ! $cubins -gt 0 ]]; then
  say "the new library embeds no Triton cubins (ky_triton_cubins() = $cubins): $OUT_DIR left as it was" >&2
  exit 1
fi
cp "${built[0]}" "$OUT_DIR/.$name.partial"
mv -f "$OUT_DIR/.$name.partial" "$OUT_DIR/$name"
for earlier in "$OUT_DIR"/_yoso_native*.so; do
  if [[ $(basename "$earlier") != "$name" ]]; then
    say "removing $earlier (an earlier build for another Python)"
    rm -f "$earlier"
  fi
done
library="$OUT_DIR/$name"
say "built $library in $((SECONDS - started)) s (CUDA kernels for $ARCHS)"

# 3. What to carry, and the command.
"$PYTHON" -c 'import ctypes, sys
library = ctypes.CDLL(sys.argv[1])
library.ky_build_info.restype = ctypes.c_char_p
print(f"ky_triton_cubins() = {library.ky_triton_cubins()}; {library.ky_build_info().decode()}")' "$library"
if [[ $(realpath "$OUT_DIR") != $(realpath keras_yoso) ]]; then
  say "verify.py loads keras_yoso/_yoso_native*.so; this library went to $OUT_DIR (a check of this script): nothing to carry"
  exit 0
fi
carry=("keras_yoso/$name")
if [[ -d .whl ]]; then
  carry=(.whl "${carry[@]}")
else
  say "warning: no .whl/ with keras for the GPU image: run tests/gpu/carry_wheels.sh too" >&2
fi
for path in "${carry[@]}"; do
  if ! git check-ignore -q "$path"; then
    say "note: $path is not ignored by git: the device tool carries it anyway"
  fi
done
echo
echo "device run: carry [$(printf '"%s", ' "${carry[@]}" | sed 's/, $//')], timeout_s $((DEADLINE + 60)), command:"
echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site" \
  ".whl/*.whl || echo 'wheel install failed'; export PYTHONPATH=/tmp/site:\$PWD; set -o pipefail;" \
  "PYTHONUNBUFFERED=1 timeout $((DEADLINE + 20)) python3 tests/gpu/verify.py --out \$OUT --deadline $DEADLINE" \
  "2>&1 | tee \$OUT/log.txt"
