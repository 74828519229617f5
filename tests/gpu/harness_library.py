"""Loads the standalone CUDA kernel library of tests/gpu (no TensorFlow, no pytest).

build.sh compiles custom_ops/cc/kernels/yoso_gpu.cu with the extern "C" shims of
harness_api.cu into build/libyoso_gpu_harness.so. Shared by the GPU test module and
benchmarks/gpu_kernels.py.
"""

import ctypes
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(HERE, "build", "libyoso_gpu_harness.so")

# keras_yoso::ScalarType values.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}

_I64, _PTR, _INT, _U64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64
_DIMS8 = [_I64] * 8
SIGNATURES = {
    "yoso_count_invalid_codes": (_INT, [_PTR, _I64, _I64, _PTR, _PTR]),
    "yoso_gaussian_hash_codes": (_INT, [_I64] * 5 + [_INT, _PTR, _PTR, _PTR, _PTR]),
    "yoso_hadamard_hash_codes": (_INT, [_I64] * 7 + [_INT, _PTR, _PTR, _PTR, _PTR]),
    "yoso_lsh_cumulation_workspace_bytes": (_U64, _DIMS8),
    "yoso_lsh_cumulation": (_INT, _DIMS8 + [_INT] + [_PTR] * 7 + [_U64, _PTR]),
    "yoso_weighted_lsh_cumulation_workspace_bytes": (_U64, _DIMS8),
    "yoso_weighted_lsh_cumulation": (_INT, _DIMS8 + [_INT] + [_PTR] * 9 + [_U64, _PTR]),
    "yoso_collision_cumulation_workspace_bytes": (_U64, _DIMS8),
    "yoso_collision_cumulation": (
        _INT, _DIMS8 + [_INT, _INT, ctypes.c_float] + [_PTR] * 10 + [_U64, _PTR]),
}


def build(arch="native"):
    """Runs build.sh (nvcc) for `arch` unless KERAS_YOSO_CUDA_ARCHS is set; raises CalledProcessError."""
    env = dict(os.environ)
    env.setdefault("KERAS_YOSO_CUDA_ARCHS", arch)
    subprocess.run(["bash", os.path.join(HERE, "build.sh")], check=True, env=env)


def load_library(rebuild=False):
    """The ctypes library with every launcher's signature set, built first if missing (or `rebuild`)."""
    if rebuild or not os.path.exists(LIBRARY):
        build()
    library = ctypes.CDLL(LIBRARY)
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(library, name)
        fn.restype, fn.argtypes = restype, argtypes
    return library
