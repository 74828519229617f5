#!/usr/bin/env bash
# Builds the TF-free CUDA kernels (custom_ops/cc/kernels/yoso_gpu.cu) and the
# ctypes shims (tests/gpu/harness_api.cu) into
# tests/gpu/build/libyoso_gpu_harness.so. Needs only nvcc; no TensorFlow.
#
# Environment:
#   KERAS_YOSO_CUDA_ARCHS  semicolon-separated SM versions (default "75;80;86;89;90",
#                          as in setup.py; SASS for each plus PTX for the newest),
#                          or "native" for the GPUs of this machine only (fastest build).
#   NVCC                   nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
kernels="${root}/custom_ops/cc/kernels"
out_dir="${here}/build"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
archs="${KERAS_YOSO_CUDA_ARCHS:-75;80;86;89;90}"

arch_flags=()
if [[ "${archs}" == "native" ]]; then
  arch_flags=(-arch=native)
else
  newest=0
  IFS=';' read -ra arch_list <<< "${archs}"
  for arch in "${arch_list[@]}"; do
    [[ -z "${arch}" ]] && continue
    arch_flags+=(-gencode "arch=compute_${arch},code=sm_${arch}")
    (( arch > newest )) && newest="${arch}"
  done
  if (( newest == 0 )); then
    echo "build.sh: KERAS_YOSO_CUDA_ARCHS='${archs}' names no SM version" >&2
    exit 2
  fi
  arch_flags+=(-gencode "arch=compute_${newest},code=compute_${newest}")
fi

mkdir -p "${out_dir}"
set -x
"${nvcc}" -O3 -std=c++17 -Xcompiler -fPIC -shared "${arch_flags[@]}" \
  -I"${kernels}" \
  "${kernels}/yoso_gpu.cu" "${here}/harness_api.cu" \
  -o "${out_dir}/libyoso_gpu_harness.so"
