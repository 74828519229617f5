"""Build and install keras-yoso.

`pip install .` compiles custom_ops/ into two libraries:

- keras_yoso/_yoso_native*.so, the framework-neutral native library: the C ABI of the kernels
  (custom_ops/cc/c_api) and the XLA FFI handlers (custom_ops/cc/jax), built with a C++ compiler,
  plus the CUDA kernels and the static CUDA runtime when nvcc is found (the runtime opens libcuda
  only when a GPU entry first runs, so the library still loads on machines without CUDA). The
  handlers need the header-only XLA FFI API, which the build takes from the pinned jaxlib that
  custom_ops/pep517_backend.py adds to the build requirements; the library does not link to
  jaxlib, torch or TensorFlow, so JAX (through XLA FFI) and PyTorch (through ctypes and
  torch.library) use it whichever of them is installed, before or after keras-yoso.
- keras_yoso/_yoso_ops*.so, the TensorFlow op library, when TensorFlow is importable at build
  time, with the compile and link flags TensorFlow reports (tf.sysconfig). When nvcc is found
  and KERAS_YOSO_CUDA is not "0", GPU kernels are registered too.

When nvcc is found and KERAS_YOSO_CUDA is not "0", the CUDA kernels (custom_ops/cc/kernels/*.cu)
are compiled once (SASS for KERAS_YOSO_CUDA_ARCHS, default 75;80;86;89;90, plus PTX for the newest)
and linked into both libraries.

The package itself needs only Keras 3 and NumPy (JAX, PyTorch or TensorFlow as the Keras
backend); the extras pull in the rest:
  .[tensorflow]   TensorFlow 2.21 and tensorflow-text (the custom ops, built at install, run on it)
  .[jax] / .[torch]   those backends (the keras.ops composite runs on them)
  .[examples]     what the examples add on every backend (matplotlib); combine: .[jax,examples]
  .[test]         what the test suite needs (TensorFlow backend)
  .[docs]         the documentation site's build (docs/requirements.txt)
  .[gpu-build]    Triton and PyTorch, to test and compile the bucket-sorted GPU kernels (custom_ops/triton)

Environment:
  KERAS_YOSO_BUILD_CUSTOM_OPS=0  build no library at all: a pure-Python install (the composite)
  KERAS_YOSO_BUILD_TF_OPS=0  build the native library only: no TensorFlow at build time (JAX, torch)
  KERAS_YOSO_CUDA=0          build the CPU kernels only, even if nvcc is present
  KERAS_YOSO_CUDA_ARCHS=...  semicolon-separated SM versions, e.g. "80;90"
  CUDA_HOME=/path            CUDA toolkit root (default: from nvcc, else /usr/local/cuda)
  KERAS_YOSO_JOBS=N          parallel compile jobs, and nvcc threads (default: CPU count)
  KERAS_YOSO_COMPILE_CACHE=DIR  reuse the object files an earlier build made from the same command
                             and the same files (custom_ops/compile_cache.py; CI's wheel build)
  KERAS_YOSO_TRITON_CUBINS=DIR  embed the Triton kernels' cubins of an AOT build
                             (python custom_ops/triton/aot.py --out DIR; docs/build.md) in both libraries:
                             lsh_cumulation and lower_bound_gradients then run them on sm_80 / sm_90 GPUs

Every build first deletes the op libraries (and objects) of earlier builds at its output paths,
so a wheel holds the library of this build or none. It prints each compile and how long it took
(pip shows that output only with `pip install -v .`).
"""

import glob
import os
import re
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
C_API = os.path.join("custom_ops", "cc", "c_api")
NATIVE_SOURCES = [os.path.join(C_API, "yoso_c_api.cc"), os.path.join(C_API, "yoso_c_api_device.cc")]
XLA_FFI_SOURCES = [os.path.join("custom_ops", "cc", "jax", "yoso_xla_ffi.cc")]
TF_GLUE = os.path.join("custom_ops", "cc", "tf")
CC_SOURCES = [os.path.join(TF_GLUE, "yoso_kernels.cc"), os.path.join(TF_GLUE, "yoso_ops.cc")]
CUDA_SOURCES = [os.path.join(KERNELS, "yoso_gpu.cu")]
# The driver-API launcher of the Triton cubins (plain C++, libcuda opened at run time) and the cubin
# table: none, or the one custom_ops/triton/embed.py writes from KERAS_YOSO_TRITON_CUBINS.
TRITON_SOURCES = [os.path.join(KERNELS, "triton_launch.cc")]
NO_TRITON_CUBINS = os.path.join(KERNELS, "triton_cubins_none.cc")
DEFAULT_ARCHS = "75;80;86;89;90"
# Seconds between the "still compiling" lines: each line also turns pip's spinner.
HEARTBEAT_SECONDS = 15

sys.path.insert(0, os.path.join(HERE, "custom_ops"))
from compile_cache import compile_object  # noqa: E402
from pep517_backend import OLDEST_JAX, TENSORFLOW_REQUIREMENT  # noqa: E402  (their one home: build and extras)

TENSORFLOW_TEXT = "tensorflow-text>=2.21,<2.22"
KERAS_HUB = "keras-hub>=0.21"  # keras_hub.layers.TransformerEncoder/Decoder, BertBackbone from Hugging Face files


def _version():
    """keras_yoso/_version.py's __version__ (read, not imported: the package needs Keras)."""
    with open(os.path.join(HERE, "keras_yoso", "_version.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"$', f.read(), flags=re.M).group(1)


def _requirements(*path):
    """The requirement lines of the file at `path` (from the source root), comments dropped."""
    with open(os.path.join(HERE, *path), encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]


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


def _cuda_archs():
    return [a.strip() for a in os.environ.get("KERAS_YOSO_CUDA_ARCHS", DEFAULT_ARCHS).split(";") if a.strip()]


def _gencode_flags():
    archs = _cuda_archs()
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


def _compile(cmd):
    """Runs the compile command `cmd`, or with KERAS_YOSO_COMPILE_CACHE=DIR takes its object from
    DIR when the same command already compiled the same files (custom_ops/compile_cache.py)."""
    cache = os.environ.get("KERAS_YOSO_COMPILE_CACHE")
    if not cache:
        return _run(cmd)
    return compile_object(cmd, HERE, os.path.abspath(cache), _run, _say)


def _compile_all(jobs, workers):
    """Runs the compile commands {source: cmd} on `workers` threads, saying when each starts and
    ends and, every HEARTBEAT_SECONDS, which are still running."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        running = {pool.submit(_compile, cmd): source for source, cmd in jobs.items()}
        _say(f"compiling {', '.join(jobs)} ({workers} parallel job(s); up to 4 minutes on 2 cores)")
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


def _building_libraries():
    """False when KERAS_YOSO_BUILD_CUSTOM_OPS=0 (a pure-Python install)."""
    if os.environ.get("KERAS_YOSO_BUILD_CUSTOM_OPS", "1") == "0":
        _say("KERAS_YOSO_BUILD_CUSTOM_OPS=0: no native library and no op library (keras.ops composite only)")
        return False
    return True


def _tensorflow_importable():
    if os.environ.get("KERAS_YOSO_BUILD_TF_OPS", "1") == "0":
        _say("KERAS_YOSO_BUILD_TF_OPS=0: no TensorFlow op library (on TensorFlow every op runs on the composite)")
        return False
    try:
        import tensorflow  # noqa: F401
    except ImportError as error:
        _say(f"TensorFlow is not importable at build time ({error}): no TensorFlow op library is built "
             "(the native library serves JAX and PyTorch; on TensorFlow every op runs on the composite)")
        return False
    return True


def _xla_ffi_include_dir():
    """The include folder of the installed jaxlib's header-only XLA FFI API (None: not installed).

    Found without importing jax: the build environment holds jaxlib only for its headers.
    """
    import importlib.util

    spec = importlib.util.find_spec("jaxlib")
    for root in (spec.submodule_search_locations or []) if spec else []:
        include = os.path.join(root, "include")
        if os.path.exists(os.path.join(include, "xla", "ffi", "api", "ffi.h")):
            return include
    return None


def _triton_sources(build_temp):
    """The launcher and the cubin table: the AOT build named by KERAS_YOSO_TRITON_CUBINS embedded
    (custom_ops/triton/embed.py writes the table into build_temp), or no cubins."""
    cubins = os.environ.get("KERAS_YOSO_TRITON_CUBINS")
    if not cubins:
        return TRITON_SOURCES + [NO_TRITON_CUBINS]
    if not os.path.isfile(os.path.join(cubins, "manifest.json")):
        raise SystemExit(f"KERAS_YOSO_TRITON_CUBINS={cubins} holds no manifest.json (build it with "
                         f"python custom_ops/triton/aot.py --out {cubins})")
    sys.path.insert(0, os.path.join(HERE, "custom_ops", "triton"))
    import embed  # noqa: E402  (needs no Triton)

    os.makedirs(build_temp, exist_ok=True)
    table = os.path.join(os.path.abspath(build_temp), "triton_cubins.cc")
    with open(table, "w", encoding="utf-8") as out:
        out.write(embed.cubins_source(cubins))
    _say(f"embedding the Triton cubins of {cubins}")
    return TRITON_SOURCES + [table]


def _jobs():
    """Parallel compile jobs (and nvcc threads): KERAS_YOSO_JOBS, default the CPU count."""
    return max(1, int(os.environ.get("KERAS_YOSO_JOBS", os.cpu_count() or 1)))


def _cxx():
    return os.environ.get("CXX", "g++")


def _cuda_link_flags(cuda_home):
    """The static CUDA runtime (it opens libcuda itself, at the first CUDA call)."""
    return ["-L" + os.path.join(cuda_home, "lib64"), "-l:libcudart_static.a", "-lrt", "-ldl", "-lpthread"]


class BuildLibraries(build_ext):
    """Builds the native library (C++ compiler only) and the TensorFlow op library (TF's own flags)."""

    def build_extension(self, ext):
        out_path = self.get_ext_fullpath(ext.name)
        *package, name = ext.name.split(".")
        _remove_earlier_libraries(name, {os.path.dirname(out_path), os.path.join(self.build_lib, *package)})
        build_dir = os.path.join(os.path.abspath(self.build_temp), name)
        shutil.rmtree(build_dir, ignore_errors=True)  # objects of an earlier build are never linked
        if not _building_libraries():
            return
        if name == "_yoso_native":
            self._build_native(out_path, build_dir)
        elif _tensorflow_importable():
            self._build_tf_ops(out_path, build_dir)

    def _build_native(self, out_path, build_dir):
        start = time.perf_counter()
        include = _xla_ffi_include_dir()
        sources = NATIVE_SOURCES + _triton_sources(self.build_temp) + (XLA_FFI_SOURCES if include else [])
        if include is None:
            _say("no jaxlib headers at build time: the native library holds no XLA FFI handlers "
                 "(JAX then runs the composite; PyTorch is unaffected)")
        flags = ["-O3", "-fPIC", "-std=c++17", "-fvisibility=hidden", "-pthread",
                 "-I" + os.path.join(HERE, KERNELS), "-I" + os.path.join(HERE, C_API)]
        if include:
            flags += ["-isystem", include]  # XLA's headers: their warnings are not ours
        # Export the ky_* entries only (template instantiations, ifunc resolvers and the static CUDA
        # runtime stay local).
        link = ["-pthread", "-ldl", "-Wl,--version-script=" + os.path.join(HERE, C_API, "exports.map")]
        nvcc, cuda_home = _find_cuda()
        cuda_jobs = {}
        if cuda_home:
            flags += ["-DKY_WITH_CUDA=1", f'-DKY_CUDA_ARCHS="{";".join(_cuda_archs())}"',
                      "-isystem", os.path.join(cuda_home, "include")]
            cuda_jobs = self._cuda_jobs(nvcc)
            link += _cuda_link_flags(cuda_home)
        self._compile_and_link(sources, flags, link, out_path, build_dir, cuda_jobs)
        parts = ["C ABI"] + (["XLA FFI handlers"] if include else []) + (["CUDA kernels"] if cuda_home else [])
        _say(f"built {out_path} ({' + '.join(parts)}) in {time.perf_counter() - start:.0f} s")

    def _cuda_jobs(self, nvcc):
        """{source: (nvcc command, object)} of the CUDA kernels, or {} where an earlier library of this
        build already compiled them with the same command (the object is reused, not rebuilt)."""
        cuda_dir = os.path.join(os.path.abspath(self.build_temp), "_cuda")
        jobs = {}
        for src in CUDA_SOURCES:
            obj = os.path.join(cuda_dir, os.path.basename(src) + ".o")
            # --threads: one SASS target per thread (about 30 s each on one core; serial, the five
            # default targets were the build's longest job).
            cmd = [nvcc, "-c", src, "-o", obj, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--threads",
                   str(_jobs()),
                   "-I" + os.path.join(HERE, KERNELS)] + _gencode_flags()
            jobs[src] = (cmd, obj)
        compiled = getattr(self, "_compiled_cuda", {})
        if all(compiled.get(src) == cmd for src, (cmd, _) in jobs.items()):
            return {src: (None, obj) for src, (_, obj) in jobs.items()}
        shutil.rmtree(cuda_dir, ignore_errors=True)
        os.makedirs(cuda_dir)
        self._compiled_cuda = {src: cmd for src, (cmd, _) in jobs.items()}
        return jobs

    def _build_tf_ops(self, out_path, build_dir):
        import tensorflow as tf

        start = time.perf_counter()
        compile_flags = tf.sysconfig.get_compile_flags()
        nvcc, cuda_home = _find_cuda()
        common = ["-O3", "-fPIC", "-Wno-deprecated-declarations", "-I" + os.path.join(HERE, KERNELS)] + compile_flags
        if cuda_home:
            common += ["-DGOOGLE_CUDA=1", "-I" + os.path.join(cuda_home, "include")]
        extra_jobs = {}
        sources = CC_SOURCES
        link = tf.sysconfig.get_link_flags()
        if cuda_home:
            extra_jobs = self._cuda_jobs(nvcc)
            sources = CC_SOURCES + _triton_sources(self.build_temp)
            link += _cuda_link_flags(cuda_home)
        self._compile_and_link(sources, common, link, out_path, build_dir, extra_jobs)
        _say(f"built {out_path} ({'CPU + CUDA' if cuda_home else 'CPU only'}) in {time.perf_counter() - start:.0f} s")

    @staticmethod
    def _compile_and_link(sources, flags, link_flags, out_path, build_dir, extra_jobs=None):
        """Compiles `sources` with `flags` (plus extra_jobs {source: (cmd, object)}; cmd None: the object
        is already built) in parallel, then links them into the shared library `out_path`."""
        os.makedirs(build_dir)
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        jobs, objects = {}, []
        for src in sources:
            obj = os.path.join(build_dir, os.path.basename(src) + ".o")
            jobs[src] = [_cxx(), "-c", src, "-o", obj] + flags
            objects.append(obj)
        for src, (cmd, obj) in (extra_jobs or {}).items():
            if cmd is not None:
                jobs[src] = cmd
            objects.append(obj)
        _compile_all(jobs, _jobs())
        link = [_cxx(), "-shared", "-o", out_path] + objects + link_flags
        _say(f"linked {os.path.basename(out_path)} in {_run(link):.0f} s")


setup(
    name="keras-yoso",
    version=_version(),
    description="Linear-cost attention for long sequences in Keras 3 (TensorFlow, JAX, PyTorch): YOSO and Scaleformer",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["keras_yoso", "keras_yoso.*"]),
    ext_modules=[Extension("keras_yoso._yoso_native", sources=[]), Extension("keras_yoso._yoso_ops", sources=[])],
    cmdclass={"build_ext": BuildLibraries},
    install_requires=["keras>=3.6", "numpy"],
    extras_require={
        # tensorflow-text: the examples' raw-string SavedModels tokenize in the graph with it.
        "tensorflow": [TENSORFLOW_REQUIREMENT, TENSORFLOW_TEXT],
        "jax": [OLDEST_JAX],
        "torch": ["torch>=2.4"],
        # What the examples need on every backend (history.png); combine with a backend's extra.
        "examples": ["matplotlib"],
        # keras-hub models for keras_yoso.replace_attention, and the Hugging Face checkpoints
        # (safetensors) that examples/convert_pretrained.py reads. Never needed at run time otherwise.
        "hub": [KERAS_HUB, "safetensors"],
        "test": [TENSORFLOW_REQUIREMENT, TENSORFLOW_TEXT, KERAS_HUB, "safetensors", "pytest>=8", "hypothesis>=6.100",
                 "matplotlib"],
        # The documentation site (mkdocs build --strict), and the Triton kernels' tests and AOT build.
        "docs": _requirements("docs", "requirements.txt"),
        "gpu-build": _requirements("custom_ops", "triton", "requirements.txt") + ["torch>=2.4"],
    },
    zip_safe=False,
)
