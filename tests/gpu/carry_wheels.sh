#!/usr/bin/env bash
# Prepares the one verification run of tests/gpu/verify.py on a GPU machine that has no network and
# no keras: downloads into the repository's .whl/ folder (ignored through .git/info/exclude) the
# wheels for CPython 3.12 on manylinux x86_64 of keras (the version installed beside $PYTHON),
# namex, optree and keras-hub (benchmarks/quality/gpu_scale.py's Gated DeltaNet is keras-hub's layer),
# and of every other package they need (markers evaluated for that platform) that the GPU image lacks
# and that an import needs (IMPORT_OPTIONAL names those it does not), then prints what to carry and
# the command to run there.
#
#   PYTHON=/path/to/venv/bin/python bash tests/gpu/carry_wheels.sh
#
# PYTHON: the interpreter whose keras, namex and optree versions are carried (default python3).
# GPU_IMAGE_PACKAGES: a file naming the packages of the GPU image (default: the workplace's list of
#   the device kinds, its "Packages:" line); without it, every requirement is carried.
# DEADLINE: verify.py's --deadline in seconds (default 400; the command's timeout is 20 s more).
set -euo pipefail

PYTHON=${PYTHON:-python3}
GPU_IMAGE_PACKAGES=${GPU_IMAGE_PACKAGES:-/work/.library/device/KINDS.md}
DEADLINE=${DEADLINE:-400}
WHEELS=.whl
# Requirements of keras-hub that `import keras_hub` and its Gated DeltaNet layer do without on the JAX
# backend (checked 2026-11-30 with these modules blocked): TensorFlow's text ops, Kaggle's preset downloads.
IMPORT_OPTIONAL="tensorflow-text kagglehub kagglesdk"

cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/$WHEELS/" "$exclude" 2>/dev/null || echo "/$WHEELS/" >>"$exclude"
rm -rf "$WHEELS"
mkdir -p "$WHEELS"

installed_version() {
  "$PYTHON" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'
}

download() {  # NAME [VERSION]
  local spec=$1
  [[ -n ${2:-} ]] && spec="$1==$2"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "$spec"
}

keras_version=$(installed_version keras)
if [[ -z $keras_version ]]; then
  echo "carry_wheels.sh: $PYTHON has no keras; set PYTHON to the interpreter of the project's venv" >&2
  exit 1
fi
if [[ -z $(installed_version keras-hub) ]]; then
  echo "carry_wheels.sh: $PYTHON has no keras-hub; set PYTHON to the interpreter of the project's venv" >&2
  exit 1
fi
for name in keras namex optree keras-hub; do
  download "$name" "$(installed_version "$name")"
done

# Every requirement of the carried wheels, for CPython 3.12 on Linux x86_64, that is neither carried
# nor in the GPU image: carried too (the venv's version where it has one), until none is left.
while true; do
  missing=$("$PYTHON" - "$WHEELS" "$GPU_IMAGE_PACKAGES" "$IMPORT_OPTIONAL" <<'PY'
import glob, os, re, sys, zipfile
from packaging.markers import default_environment
from packaging.requirements import Requirement

wheels, image_list = sys.argv[1], sys.argv[2]
normal = lambda name: re.sub(r"[-_.]+", "-", name).lower()
image = set()
if os.path.isfile(image_list):
    text = open(image_list).read()
    found = re.search(r"^.*Packages: (.*)$", text, re.M)
    image = {normal(n.strip().rstrip(".")) for n in found.group(1).split(",")} if found else set()
environment = dict(default_environment(), python_version="3.12", python_full_version="3.12.3",
                   sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
                   implementation_name="cpython", platform_python_implementation="CPython", extra="")
carried, needed = set(), set()
for path in glob.glob(os.path.join(wheels, "*.whl")):
    carried.add(normal(os.path.basename(path).split("-")[0]))
    with zipfile.ZipFile(path) as wheel:
        metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        for line in wheel.read(metadata).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                requirement = Requirement(line.split(":", 1)[1].strip())
                if requirement.marker is None or requirement.marker.evaluate(environment):
                    needed.add(normal(requirement.name))
optional = {normal(name) for name in sys.argv[3].split()}
print(" ".join(sorted(needed - carried - image - optional)))
PY
)
  [[ -z $missing ]] && break
  for name in $missing; do
    echo "carry_wheels.sh: $name is needed and not in the GPU image: carried too"
    download "$name" "$(installed_version "$name")"
  done
done

libraries=(keras_yoso/_yoso_native*.so)
if [[ ! -e ${libraries[0]} ]]; then
  echo "carry_wheels.sh: warning: no keras_yoso/_yoso_native*.so yet: build it first (with nvcc, for sm_80 and sm_90)" >&2
  libraries=()
fi

echo "wheels in $WHEELS/ ($(du -sh "$WHEELS" | cut -f1)):"
ls "$WHEELS"
carry=$(printf '"%s", ' "$WHEELS" "${libraries[@]}")
echo
echo "device run: carry [${carry%, }], timeout_s $((DEADLINE + 60)), command:"
echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site" \
  "$WHEELS/*.whl || echo 'wheel install failed'; export PYTHONPATH=/tmp/site:\$PWD; set -o pipefail;" \
  "PYTHONUNBUFFERED=1 timeout $((DEADLINE + 20)) python3 tests/gpu/verify.py --out \$OUT --deadline $DEADLINE" \
  "2>&1 | tee \$OUT/log.txt"
