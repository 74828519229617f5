"""Build and install keras-yoso.

`pip install .` compiles custom_ops/ into one TensorFlow op library,
keras_yoso/_yoso_ops*.so, with the compile and link flags TensorFlow reports
(tf.sysconfig). When nvcc is found and KERAS_YOSO_CUDA is not "0", the CUDA
kernels are compiled too (SASS for KERAS_YOSO_CUDA_ARCHS, default
75;80;86;89;90, plus PTX for the newest) and GPU kernels are registered.

The package itself needs only Keras 3 and NumPy (JAX, PyTorch or TensorFlow as the Keras
backend); the extras pull in the rest:
  .[tensorflow]   TensorFlow 2.21 and tensorflow-text (the custom ops, built at install, run on it)
  .[jax] / .[torch]   those backends (the keras.ops composite runs on them)
  .[examples]     what the examples add on every backend (matplotlib); combine: .[jax,examples]
  .[test]         what the test suite needs (TensorFlow backend)

Environment:
  KERAS_YOSO_BUILD_CUSTOM_OPS=0  build no op library and need no TensorFlow to build (JAX, torch)
  KERAS_YOSO_CUDA=0          build the CPU kernels only, even if nvcc is present
  KERAS_YOSO_CUDA_ARCHS=...  semicolon-separated SM versions, e.g. "80;90"
  CUDA_HOME=/path            CUDA toolkit root (default: from nvcc, else /usr/local/cuda)
  KERAS_YOSO_JOBS=N          parallel compile jobs (default: CPU count)

Every build first deletes the op libraries (and objects) of earlier builds at its output paths,
so a wheel holds the library of this build or none. It prints each compile and how long it took
(pip shows that output only with `pip install -v .`).
"""

import glob
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("custom_ops", "cc", "kernels")
CC_SOURCES = [os.path.join(KERNELS, "yoso_kernels.cc"), os.path.join("custom_ops", "cc", "ops", "yoso_ops.cc")]
CUDA_SOURCES = [os.path.join(KERNELS, "yoso_gpu.cu")]
DEFAULT_ARCHS = "75;80;86;89;90"
# Seconds between the "still compiling" lines: each line also turns pip's spinner.
HEARTBEAT_SECONDS = 15

sys.path.insert(0, os.path.join(HERE, "custom_ops"))
from pep517_backend import TENSORFLOW_REQUIREMENT  # noqa: E402  (its one home: build and extras)

TENSORFLOW_TEXT = "tensorflow-text>=2.21,<2.22"


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


def _say(message):
    print(f"keras-yoso: {message}", flush=True)


def _run(cmd):
    """Runs `cmd` in the source root; returns its wall time in seconds."""
    print(" ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.check_call(cmd, cwd=HERE)
    return time.perf_counter() - start


def _compile_all(jobs, workers):
    """Runs the compile commands {source: cmd} on `workers` threads, saying when each starts and
    ends and, every HEARTBEAT_SECONDS, which are still running."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        running = {pool.submit(_run, cmd): source for source, cmd in jobs.items()}
        _say(f"compiling {', '.join(jobs)} ({workers} parallel job(s); 2 to 4 minutes on 2 cores)")
        while running:
            done, _ = wait(running, timeout=HEARTBEAT_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                _say(f"compiled {running.pop(future)} in {future.result():.0f} s")
            if running and not done:
                _say(f"still compiling {', '.join(running.values())} ({time.perf_counter() - start:.0f} s)")


def _remove_earlier_libraries(name, directories):
    """Deletes the libraries `name`*.so an earlier build left in `directories`, whatever their Python
    tag: a wheel must hold the library of this build, or none."""
    for directory in directories:
        for path in glob.glob(os.path.join(directory, name + "*.so")):
            _say(f"removing {path} (left by an earlier build)")
            os.remove(path)


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
        out_path = self.get_ext_fullpath(ext.name)
        *package, name = ext.name.split(".")
        _remove_earlier_libraries(name, {os.path.dirname(out_path), os.path.join(self.build_lib, *package)})
        build_dir = os.path.join(os.path.abspath(self.build_temp), "keras_yoso_ops")
        shutil.rmtree(build_dir, ignore_errors=True)  # objects of an earlier build are never linked
        if not _build_custom_ops():
            return
        import tensorflow as tf

        start = time.perf_counter()
        compile_flags = tf.sysconfig.get_compile_flags()
        link_flags = tf.sysconfig.get_link_flags()
        nvcc, cuda_home = _find_cuda()
        os.makedirs(build_dir)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)

        cxx = os.environ.get("CXX", "g++")
        common = ["-O3", "-fPIC", "-Wno-deprecated-declarations", "-I" + os.path.join(HERE, KERNELS)] + compile_flags
        if cuda_home:
            common += ["-DGOOGLE_CUDA=1", "-I" + os.path.join(cuda_home, "include")]
        jobs = {}
        objects = []
        for src in CC_SOURCES:
            obj = os.path.join(build_dir, os.path.basename(src) + ".o")
            jobs[src] = [cxx, "-c", src, "-o", obj] + common
            objects.append(obj)
        if cuda_home:
            std = next((f for f in compile_flags if f.startswith(("--std=", "-std="))), "-std=c++17")
            for src in CUDA_SOURCES:
                obj = os.path.join(build_dir, os.path.basename(src) + ".o")
                jobs[src] = [nvcc, "-c", src, "-o", obj, "-O3", std.replace("--std", "-std"),
                             "-Xcompiler", "-fPIC", "-I" + os.path.join(HERE, KERNELS)] + _gencode_flags()
                objects.append(obj)
        _compile_all(jobs, max(1, int(os.environ.get("KERAS_YOSO_JOBS", os.cpu_count() or 1))))

        link = [cxx, "-shared", "-o", out_path] + objects + link_flags
        if cuda_home:
            link += ["-L" + os.path.join(cuda_home, "lib64"), "-l:libcudart_static.a", "-lrt", "-ldl", "-lpthread"]
        _say(f"linked {os.path.basename(out_path)} in {_run(link):.0f} s")
        _say(f"built {out_path} ({'CPU + CUDA' if cuda_home else 'CPU only'}) in {time.perf_counter() - start:.0f} s")


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
        # tensorflow-text: the examples' raw-string SavedModels tokenize in the graph with it.
        "tensorflow": [TENSORFLOW_REQUIREMENT, TENSORFLOW_TEXT],
        "jax": ["jax>=0.4.30"],
        "torch": ["torch>=2.4"],
        # What the examples need on every backend (history.png); combine with a backend's extra.
        "examples": ["matplotlib"],
        "test": [TENSORFLOW_REQUIREMENT, TENSORFLOW_TEXT, "pytest>=8", "hypothesis>=6.100", "matplotlib"],
    },
    zip_safe=False,
)
