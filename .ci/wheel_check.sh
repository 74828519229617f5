#!/usr/bin/env bash
# Installs the wheel of .ci/build_wheel.sh into a fresh venv per backend with no compiler on PATH and
# runs .ci/wheel_smoke.py there (CI; docs/build.md, "A wheel").
#   bash .ci/wheel_check.sh WHEEL
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$(readlink -f "$1")
PYTHON=${PYTHON:-python3}
smoke=$(readlink -f .ci/wheel_smoke.py)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# The backend's requirement, as a user installs it (torch: the CPU build on this machine's disk).
declare -A requirement=([tensorflow]="$wheel[tensorflow]" [jax]="$wheel[jax]" [torch]="torch==2.13.0")
for backend in tensorflow jax torch; do
  venv="$root/$backend"
  "$PYTHON" -m venv "$venv"
  # Only the venv's own programs: no gcc, g++, cc or nvcc can be found while installing and running.
  nocompiler="$venv/bin"
  PATH="$nocompiler" "$venv/bin/python" -m pip install -q --upgrade pip
  # --no-compile: no .pyc for the frameworks' thousands of modules that the smoke test never imports
  # (TensorFlow: 94 s instead of 140 s here); Python still writes one for each module it imports.
  PATH="$nocompiler" "$venv/bin/python" -m pip install -q --no-compile "$wheel" ${requirement[$backend]}
  for tool in gcc g++ cc c++ nvcc; do
    if env PATH="$nocompiler" /bin/sh -c "command -v $tool" >/dev/null; then
      echo "!! $tool is on the smoke test's PATH"; exit 1
    fi
  done
  (cd "$root" && PATH="$nocompiler" KERAS_BACKEND=$backend "$venv/bin/python" "$smoke")
  rm -rf "$venv"
done
