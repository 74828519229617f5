"""Build and install keras-yoso.

`pip install .` compiles custom_ops/ into one TensorFlow op library,
keras_yoso/_yoso_ops*.so, with the compile and link flags TensorFlow reports
(tf.sysconfig). When nvcc is found and KERAS_YOSO_CUDA is not "0", the CUDA
kernels are compiled too (SASS for KERAS_YOSO_CUDA_ARCHS, default
75;80;86;89;90, plus PTX for the newest) and GPU kernels are registered.

The package itself needs only Keras 3 and NumPy (JAX, PyTorch or TensorFlow as the Keras
backend); the extras pull in the rest:
  .[tensorflow]   TensorFlow 2.21 (the custom ops, built at install, run on it)
  .[jax] / .[torch]   those backends (the keras.ops composite runs on them)
  .[examples] / .[test]   what the examples / the test suite need

Environment:
  KERAS_YOSO_BUILD_CUSTOM_OPS=0  build no op library and need no TensorFlow to build (JAX, torch)
  KERAS_YOSO_CUDA=0          build the CPU kernels only, even if nvcc is present
  KERAS_YOSO_CUDA_ARCHS=...  semicolon-separated SM versions, e.g. "80;90"
  CUDA_HOME=/path            CUDA toolkit root (default: from nvcc, else /usr/local/cuda)
  KERAS_YOSO_JOBS=N          parallel compile jobs (default: CPU count)
"""

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("custom_ops", "cc", "kernels")
CC_SOURCES = [os.path.join(KERNELS, "yoso_kernels.cc"), os.path.join("custom_ops", "cc", "ops", "yoso_ops.cc")]
CUDA_SOURCES = [os.path.join(KERNELS, "yoso_gpu.cu")]
DEFAULT_ARCHS = "75;80;86;89;90"
TENSORFLOW = "tensorflow>=2.21,<2.22"


def _find_cuda():
    """(nvcc, cuda_home) or (None, None) when CUDA is disabled or absent."""
    if os.environ.get("KERAS_YOSO_CUDA", "1") == "0":
        return None, None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return None, None
    candidates = [home] if home else []
    candidates += [os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]
    for root in candidates:
        if root and os.path.exists(os.path.join(root, "include", "cuda_runtime_api.h")):
            return nvcc, root
    raise RuntimeError(f"found nvcc at {nvcc} but no CUDA headers; set CUDA_HOME to the toolkit root")


def _gencode_flags():
    archs = [a.strip() for a in os.environ.get("KERAS_YOSO_CUDA_ARCHS", DEFAULT_ARCHS).split(";") if a.strip()]
    flags = []
    for arch in archs:
        flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    newest = max(archs, key=int)
    flags += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
    return flags


def _run(cmd):
    print(" ".join(cmd), flush=True)
    subprocess.check_call(cmd, cwd=HERE)


def _build_custom_ops():
    """False when KERAS_YOSO_BUILD_CUSTOM_OPS=0, or when TensorFlow cannot be imported (then say so)."""
    if os.environ.get("KERAS_YOSO_BUILD_CUSTOM_OPS", "1") == "0":
        print("keras-yoso: KERAS_YOSO_BUILD_CUSTOM_OPS=0: no op library (keras.ops composite only)", flush=True)
        return False
    try:
        import tensorflow  # noqa: F401
    except ImportError as error:
        print(f"keras-yoso: TensorFlow is not importable at build time ({error}): no op library is built; "
              "every op runs on the keras.ops composite", flush=True)
        return False
    return True


class BuildTfOps(build_ext):
    """Compiles the op library with TensorFlow's own flags (never hard-coded)."""

    def build_extension(self, ext):
        if not _build_custom_ops():
            return
        import tensorflow as tf

        compile_flags = tf.sysconfig.get_compile_flags()
        link_flags = tf.sysconfig.get_link_flags()
        nvcc, cuda_home = _find_cuda()
        out_path = self.get_ext_fullpath(ext.name)
        build_dir = os.path.join(os.path.abspath(self.build_temp), "keras_yoso_ops")
        os.makedirs(build_dir, exist_ok=True)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)

        cxx = os.environ.get("CXX", "g++")
        common = ["-O3", "-fPIC", "-Wno-deprecated-declarations", "-I" + os.path.join(HERE, KERNELS)] + compile_flags
        if cuda_home:
            common += ["-DGOOGLE_CUDA=1", "-I" + os.path.join(cuda_home, "include")]
        jobs = []
        objects = []
        for src in CC_SOURCES:
            obj = os.path.join(build_dir, os.path.basename(src) + ".o")
            jobs.append([cxx, "-c", src, "-o", obj] + common)
            objects.append(obj)
        if cuda_home:
            std = next((f for f in compile_flags if f.startswith(("--std=", "-std="))), "-std=c++17")
            for src in CUDA_SOURCES:
                obj = os.path.join(build_dir, os.path.basename(src) + ".o")
                jobs.append([nvcc, "-c", src, "-o", obj, "-O3", std.replace("--std", "-std"),
                             "-Xcompiler", "-fPIC", "-I" + os.path.join(HERE, KERNELS)] + _gencode_flags())
                objects.append(obj)
        workers = int(os.environ.get("KERAS_YOSO_JOBS", os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            list(pool.map(_run, jobs))

        link = [cxx, "-shared", "-o", out_path] + objects + link_flags
        if cuda_home:
            link += ["-L" + os.path.join(cuda_home, "lib64"), "-l:libcudart_static.a", "-lrt", "-ldl", "-lpthread"]
        _run(link)
        print(f"keras-yoso: built {out_path} ({'CPU + CUDA' if cuda_home else 'CPU only'})", flush=True)


setup(
    name="keras-yoso",
    version="0.2.0",
    description="Linear-cost attention for long sequences in Keras 3 (TensorFlow, JAX, PyTorch): YOSO and Scaleformer",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["keras_yoso", "keras_yoso.*"]),
    ext_modules=[Extension("keras_yoso._yoso_ops", sources=[])],
    cmdclass={"build_ext": BuildTfOps},
    install_requires=["keras>=3.6", "numpy"],
    extras_require={
        "tensorflow": [TENSORFLOW],
        "jax": ["jax>=0.4.30"],
        "torch": ["torch>=2.4"],
        "examples": [TENSORFLOW, "tensorflow-text>=2.21,<2.22", "matplotlib"],
        "test": [TENSORFLOW, "tensorflow-text>=2.21,<2.22", "pytest>=8", "hypothesis>=6.100", "matplotlib"],
    },
    zip_safe=False,
)
