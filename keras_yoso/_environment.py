"""The environment report of keras-yoso: what a bug report needs (`keras_yoso.show_config()`,
`python -m keras_yoso`).

It says which keras_yoso, Keras and backend run; per primitive, what "auto" runs on the CPU and on
a GPU ("custom_op": the native kernels; "composite": `keras.ops`); which compiled libraries were
found (path, C ABI version, how they were built, their load error); the threads the kernels use;
the CPU's vector features; and the accelerators the backend sees. Reading it changes nothing and
starts no computation.
"""

import os
import platform
import sys

import keras

from keras_yoso import _version
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec
from keras_yoso.ops.providers import native_library

# The CPU features the kernels' speed depends on (flags of /proc/cpuinfo).
_CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16",
                 "amx_tile", "amx_bf16", "asimd", "sve")
# Environment variables that change what the kernels do or how many threads they use.
_VARIABLES = ("KERAS_BACKEND", "KERAS_YOSO_DISABLE_CUSTOM_OPS", "KERAS_YOSO_TORCH_OPENMP_SPINNING", "OMP_NUM_THREADS",
              "OMP_WAIT_POLICY", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "XLA_FLAGS",
              "CUDA_VISIBLE_DEVICES")


def _cpu_features():
    """The CPU features of `_CPU_FEATURES` this machine has ("unknown" without /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            flags = next((line.split(":", 1)[1].split() for line in cpuinfo
                          if line.startswith(("flags", "Features"))), [])
    except OSError:
        return "unknown"
    return " ".join(f for f in _CPU_FEATURES if f in flags) or "none of " + " ".join(_CPU_FEATURES)


def _usable_cpus():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


def _backend_details():
    """[(field, value)] of the running backend: its version, threads and the accelerators it sees."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        threads = tf.config.threading
        return [("tensorflow", tf.__version__),
                ("threads (intra-op, inter-op; 0: TensorFlow's choice)",
                 f"{threads.get_intra_op_parallelism_threads()}, {threads.get_inter_op_parallelism_threads()}"),
                ("GPUs", ", ".join(d.name for d in tf.config.list_physical_devices("GPU")) or "none")]
    if backend == "jax":
        import jax

        return [("jax", jax.__version__), ("default backend", jax.default_backend()),
                ("devices", ", ".join(str(d) for d in jax.devices())),
                ("native kernel threads (0: every usable core)", "0")]
    if backend == "torch":
        import torch

        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() \
            else []
        return [("torch", torch.__version__), ("threads (torch.get_num_threads)", str(torch.get_num_threads())),
                ("CUDA", f"{torch.version.cuda} ({', '.join(gpus) or 'no GPU visible'})" if torch.version.cuda
                 else "CPU build")]
    return []


def _tensorflow_op_library():
    """[(field, value)] of the TensorFlow op library (TensorFlow backend only)."""
    if keras.backend.backend() != "tensorflow":
        return [("TensorFlow op library", "not used on this backend")]
    from keras_yoso.ops.providers import tensorflow as tf_provider

    error = tf_provider.load_error()
    return [("TensorFlow op library", error and f"not loaded: {error}" or "loaded"),
            ("TensorFlow op library devices", " and ".join(tf_provider.PROVIDER.devices()) if not error else "-")]


def config():
    """The report as [(section, [(field, value)])]."""
    library = native_library.library()
    native = [("native library", native_library.load_error() and f"not loaded: {native_library.load_error()}"
               or library._name),
              ("C ABI version", str(native_library.ABI_VERSION) if library is not None else "-"),
              ("built with", native_library.build_info() or "-"),
              ("CUDA kernels", "yes" if native_library.device_kernels() else "no"),
              ("Triton cubins", str(native_library.triton_cubins()) + (
                  "" if native_library.triton_cubins() else " (build with KERAS_YOSO_TRITON_CUBINS, docs/build.md)"))]
    provider, error = _dispatch.native_provider()
    runs = [("native kernels on this backend", "loaded" if provider else f"not loaded: {error}"),
            ("native kernels serve", " and ".join(provider.devices()) if provider else "-")]
    causal = _dispatch.kernels_table(causal=_spec.CAUSAL)
    for name, row in _dispatch.kernels_table().items():
        runs.append((name, ", ".join(f"{device}: {where}" for device, where in row.items())))
        if "causal" in (a.name for a in _spec.PRIMITIVES[name].attributes):
            runs.append((f"{name} (causal)", ", ".join(f"{device}: {where}" for device, where in causal[name].items())))
    system = [("python", sys.version.split()[0]), ("platform", platform.platform()),
              ("usable CPUs", str(_usable_cpus())), ("CPU features", _cpu_features())]
    system += [(name, os.environ[name]) for name in _VARIABLES if name in os.environ]
    return [("keras-yoso", [("version", _version.__version__), ("keras", keras.__version__),
                            ("backend", keras.backend.backend())] + _backend_details()),
            ("libraries", native + _tensorflow_op_library()),
            ("what 'auto' runs, per primitive and device", runs),
            ("system", system)]


def show_config(file=None):
    """Prints the environment report (`config()`) for a bug report: versions, backend, what runs each
    primitive on CPU and GPU, the compiled libraries and how they were built, threads, CPU features,
    accelerators. `python -m keras_yoso` prints the same."""
    out = file or sys.stdout
    for section, fields in config():
        print(f"{section}:", file=out)
        width = max(len(field) for field, _ in fields)
        for field, value in fields:
            print(f"  {field.ljust(width)}  {value}", file=out)
