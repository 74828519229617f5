#!/usr/bin/env bash
# Offline Bazel build of the CPU op library (//:_yoso_ops.so) with Debian 12's
# Bazel, compared op by op with the pip-built library (docs/build.md, "Bazel").
#
#   PYTHON=/path/to/venv/bin/python .ci/bazel_check.sh
#
# PYTHON: a Python with TensorFlow 2.21 and the pip-built keras_yoso installed
# (default python3). Installs bazel-bootstrap and bazel-bootstrap-source with apt
# when missing (root, or sudo). Bazel's output root is a fresh temporary
# directory, removed at exit, unless KERAS_YOSO_BAZEL_ROOT names one to use and
# keep. Exits non-zero on any failure; the last line is PASS or FAIL.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "FAIL: bazel_check: $*" >&2; exit 1; }
trap 'echo "FAIL: bazel_check: command failed (line $LINENO): $BASH_COMMAND" >&2' ERR

# Absolute path without resolving symlinks (a venv's python is a symlink out of it).
PYTHON=${PYTHON:-python3}
case "$PYTHON" in
  */*) ;;
  *) PYTHON=$(command -v "$PYTHON") || fail "no $PYTHON on PATH" ;;
esac
PYTHON="$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")"
[ -x "$PYTHON" ] || fail "PYTHON=$PYTHON is not executable"

# --- Bazel from Debian (bazel-bootstrap) and the rules_cc/rules_java stand-ins
# .bazelrc points at (bazel-bootstrap-source).
packages=()
command -v bazel >/dev/null 2>&1 || packages+=(bazel-bootstrap)
[ -d /usr/src/bazel-bootstrap/mock_repos/rules_cc ] || packages+=(bazel-bootstrap-source)
if [ ${#packages[@]} -gt 0 ]; then
  echo "== apt-get install ${packages[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || fail "need root (or sudo) to install ${packages[*]}"
    sudo=(sudo)
  fi
  start=$(date +%s)
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
  echo "installed in $(( $(date +%s) - start )) s"
fi
echo "bazel: $(command -v bazel) (Debian bazel-bootstrap $(dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null || echo '?'))"

# --- the pip-built library, found without importing keras_yoso (run from / in
# isolated mode, so a source checkout's keras_yoso/ is never picked up).
PIP_SO=$(cd / && "$PYTHON" -I -c '
import glob, importlib.util, os, sys
spec = importlib.util.find_spec("keras_yoso")
if spec is None or not spec.submodule_search_locations:
    sys.exit("keras_yoso is not installed for " + sys.executable)
found = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "_yoso_ops*.so")))
if not found:
    sys.exit("no _yoso_ops*.so in " + spec.submodule_search_locations[0])
print(found[0])
') || fail "could not find the pip-built op library with $PYTHON"
echo "pip-built library: $PIP_SO"

# --- build
if [ -n "${KERAS_YOSO_BAZEL_ROOT:-}" ]; then
  root=$KERAS_YOSO_BAZEL_ROOT
  mkdir -p "$root"
  remove_root=0
else
  root=$(mktemp -d "${TMPDIR:-/tmp}/keras-yoso-bazel.XXXXXX")
  remove_root=1
fi
bazel=(bazel --output_user_root="$root" --max_idle_secs=300)
cleanup() {
  "${bazel[@]}" shutdown >/dev/null 2>&1 || true
  if [ "$remove_root" = 1 ]; then
    chmod -R u+w "$root" 2>/dev/null || true  # Bazel leaves read-only files behind
    rm -rf "$root"
  fi
}
trap cleanup EXIT

export PYTHON_BIN_PATH=$PYTHON
echo "== bazel build //:_yoso_ops.so (offline; output root $root)"
start=$(date +%s)
# --symlink_prefix=/: no bazel-* links in the checkout (the output root may be removed).
"${bazel[@]}" build --symlink_prefix=/ //:_yoso_ops.so
build_s=$(( $(date +%s) - start ))
echo "bazel build took ${build_s} s (including the Bazel server start)"
BAZEL_SO="$("${bazel[@]}" info bazel-bin 2>/dev/null)/_yoso_ops.so"
[ -f "$BAZEL_SO" ] || fail "bazel reported success but $BAZEL_SO does not exist"

# The AVX-512 / AVX2 clones (KY_CPU_CLONES) must have survived Bazel's toolchain.
if command -v nm >/dev/null 2>&1; then
  clones=$(nm "$BAZEL_SO" | grep -cE '\.arch_x86_64_v[34]$' || true)
  [ "$clones" -gt 0 ] || fail "no arch_x86_64_v3/v4 function clones in $BAZEL_SO"
  echo "function-multiversioning clones (x86-64-v3/v4) in the Bazel build: $clones"
fi

# --- compare with the pip-built library, each in its own fresh process
echo "== compare $BAZEL_SO with $PIP_SO"
"$PYTHON" .ci/bazel_compare.py "$BAZEL_SO" "$PIP_SO" || fail "outputs differ (see above)"

trap - ERR
echo "PASS: bazel_check: //:_yoso_ops.so built offline in ${build_s} s and matches the pip-built library"
