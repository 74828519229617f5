"""The framework-neutral native library, keras_yoso/_yoso_native*.so, loaded with ctypes.

It holds the C ABI of the kernels (custom_ops/cc/c_api/yoso_c_api.h): the CPU kernels (`ky_run`)
and, when it was built with nvcc, the CUDA kernels (`ky_run_device`); and, when the build found
jaxlib's XLA FFI headers, the XLA FFI handlers (custom_ops/cc/jax/yoso_xla_ffi.cc). It links to no
framework, so it loads whichever backend is installed, and to no CUDA library (the static CUDA
runtime inside opens the driver at the first GPU call), so it loads without a GPU. The PyTorch
provider calls the C ABI through `call` and `call_device`; the JAX provider registers the handlers
(`handler`).

A missing or unloadable library gives one warning and the composite, on every backend;
`import keras_yoso` never fails because of it.
"""

import ctypes
import glob
import json
import os
import warnings

from keras_yoso.ops import _spec

# The folder of the keras_yoso package (keras_yoso/ops/providers/../..), where the compiled libraries lie.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# custom_ops/cc/c_api/yoso_c_api.h: KY_ABI_VERSION, dtype codes, return codes, KY_MAX_RANK, KY_ERROR_SIZE,
# KY_PLAN_*
# (tests/test_spec.py reads them there).
ABI_VERSION = 8
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int32": 3}
_OK, _INVALID_ARGUMENT = 0, 1
_PLAN_EXACT_FP32, _PLAN_DETERMINISTIC = 1, 2
MAX_RANK = 8
_ERROR_SIZE = 4096
REBUILD_HINT = ("Rebuild it with `pip install --force-reinstall --no-deps .` from the keras-yoso source tree "
                "(docs/build.md). Until then keras_yoso runs every op on its keras.ops composite: the same "
                "numbers, several times slower on long sequences (docs/benchmarks.md).")


class KyTensor(ctypes.Structure):
    """A tensor view of the C ABI: data pointer, dtype code, rank and shape (row-major, contiguous)."""

    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("dims", ctypes.c_int64 * MAX_RANK)]


def tensor_view(data_pointer, dtype, shape):
    """A KyTensor over memory at `data_pointer` of dtype name `dtype` and shape `shape`."""
    if len(shape) > MAX_RANK:
        raise ValueError(f"keras_yoso native kernels take tensors of rank <= {MAX_RANK}, got shape {tuple(shape)}")
    view = KyTensor()
    view.data = data_pointer
    view.dtype = DTYPE_CODES[dtype]
    view.rank = len(shape)
    for axis, size in enumerate(shape):
        view.dims[axis] = int(size)
    return view


class KyAttribute(ctypes.Structure):
    """An attribute value of the C ABI: int attributes read int_value, float attributes float_value."""

    _fields_ = [("int_value", ctypes.c_int64), ("float_value", ctypes.c_double)]


_I64, _I32 = ctypes.c_int64, ctypes.c_int32
# ky_run(primitive, inputs, num_inputs, attributes, num_attributes, outputs, num_outputs, num_threads, error,
# error_size)
_RUN_SIGNATURE = [ctypes.c_char_p, ctypes.POINTER(KyTensor), _I32, ctypes.POINTER(KyAttribute), _I32,
                  ctypes.POINTER(KyTensor), _I32, _I32, ctypes.c_char_p, _I64]
# ky_device_workspace_bytes(primitive, inputs, num_inputs, attributes, num_attributes, bytes, error, error_size)
_WORKSPACE_SIGNATURE = [ctypes.c_char_p, ctypes.POINTER(KyTensor), _I32, ctypes.POINTER(KyAttribute), _I32,
                        ctypes.POINTER(_I64), ctypes.c_char_p, _I64]
# ky_device_launch_plan(primitive, inputs, num_inputs, attributes, num_attributes, arch, exact_fp32, plan,
# plan_size, error, error_size)
_LAUNCH_PLAN_SIGNATURE = [ctypes.c_char_p, ctypes.POINTER(KyTensor), _I32, ctypes.POINTER(KyAttribute), _I32, _I32,
                          _I32, ctypes.c_char_p, _I64, ctypes.c_char_p, _I64]
# ky_run_device(primitive, inputs, num_inputs, attributes, num_attributes, outputs, num_outputs, workspace,
# workspace_bytes, stream, error, error_size)
_RUN_DEVICE_SIGNATURE = [ctypes.c_char_p, ctypes.POINTER(KyTensor), _I32, ctypes.POINTER(KyAttribute), _I32,
                         ctypes.POINTER(KyTensor), _I32, ctypes.c_void_p, _I64, ctypes.c_void_p, ctypes.c_char_p, _I64]
_INT64_RANGE = (-2 ** 63, 2 ** 63 - 1)


class LazyLibrary:
    """A compiled library of the package, loaded once, on first use (the native library here; the
    TensorFlow op library in providers/tensorflow.py).

    `open_library(path)` loads the first file matching `pattern` in the package folder; an exception
    of `errors` from it means "not loadable". When the library is disabled
    (KERAS_YOSO_DISABLE_CUSTOM_OPS=1), missing or not loadable, one RuntimeWarning says so with
    `what` (e.g. "native kernels"), the reason and `hint`, and `library()` is None.
    """

    def __init__(self, what, pattern, kind, open_library, errors, hint, stacklevel):
        self._what, self._pattern, self._kind = what, pattern, kind
        self._open, self._errors, self._hint, self._stacklevel = open_library, errors, hint, stacklevel
        self._library = None
        self._error = None
        self._loaded = False

    def _load(self):
        self._loaded = True
        candidates = sorted(glob.glob(os.path.join(_PACKAGE_DIR, self._pattern)))
        if os.environ.get("KERAS_YOSO_DISABLE_CUSTOM_OPS", "0") == "1":
            self._error = "disabled by KERAS_YOSO_DISABLE_CUSTOM_OPS=1"
        elif not candidates:
            self._error = f"no {self._kind} ({self._pattern}) in {_PACKAGE_DIR}"
        else:
            try:
                self._library = self._open(candidates[0])
            except self._errors as error:
                self._error = f"loading {candidates[0]} failed: {error}"
        if self._library is None:
            warnings.warn(f"keras_yoso {self._what} are not available ({self._error}). {self._hint}",
                          RuntimeWarning, stacklevel=self._stacklevel)

    def library(self):
        """The loaded library, or None."""
        if not self._loaded:
            self._load()
        return self._library

    def load_error(self):
        """Why the library is not loaded (None when it is)."""
        if not self._loaded:
            self._load()
        return self._error


def open_library(path):
    """The native library at `path` as ctypes, with the C ABI's signatures set (OSError if its ABI
    version is not this keras_yoso's). The package's own is `library()`; another build (e.g. to time
    two builds side by side, benchmarks/native_ab.py) can be passed to `call`."""
    library = ctypes.CDLL(path)
    version = library.ky_abi_version()
    if version != ABI_VERSION:
        raise OSError(f"it has C ABI version {version}, this keras_yoso needs {ABI_VERSION}")
    library.ky_run.argtypes = _RUN_SIGNATURE
    library.ky_run.restype = _I32
    library.ky_throttle_openmp_spinning.argtypes = [ctypes.c_void_p, _I32]
    library.ky_throttle_openmp_spinning.restype = _I32
    library.ky_build_info.argtypes = []
    library.ky_build_info.restype = ctypes.c_char_p
    library.ky_device_kernels.argtypes = []
    library.ky_device_kernels.restype = _I32
    library.ky_has_device_kernel.argtypes = [ctypes.c_char_p]
    library.ky_has_device_kernel.restype = _I32
    library.ky_device_workspace_bytes.argtypes = _WORKSPACE_SIGNATURE
    library.ky_device_workspace_bytes.restype = _I32
    library.ky_run_device.argtypes = _RUN_DEVICE_SIGNATURE
    library.ky_run_device.restype = _I32
    library.ky_device_launch_plan.argtypes = _LAUNCH_PLAN_SIGNATURE
    library.ky_device_launch_plan.restype = _I32
    library.ky_triton_cubins.argtypes = []
    library.ky_triton_cubins.restype = _I32
    return library


_LIBRARY = LazyLibrary("native kernels", "_yoso_native*.so", "native library", open_library,
                       (OSError, AttributeError), REBUILD_HINT, stacklevel=5)
library = _LIBRARY.library
load_error = _LIBRARY.load_error


def has_handler(name):
    """True when the library holds the exported symbol `name` (e.g. an XLA FFI handler)."""
    return library() is not None and hasattr(library(), name)


def handler(name):
    """The address of the exported function `name` as a ctypes function pointer (for jax.ffi.pycapsule)."""
    return getattr(library(), name)


def throttle_openmp_spinning(parallel_region, num_threads):
    """Once per process: the libgomp whose `GOMP_parallel` is at address `parallel_region` (an int)
    spins about 100 times before its idle workers sleep, not about 300,000, as under
    OMP_WAIT_POLICY=PASSIVE (custom_ops/cc/c_api/openmp_spinning.h: it holds a region of `num_threads`
    sleeping threads). True when this call did it. Called by the PyTorch provider (providers/torch.py)."""
    return bool(library().ky_throttle_openmp_spinning(parallel_region, int(num_threads)))


def _attributes(primitive, values):
    """The KyAttribute array of `values` (the primitive's attributes, in the table's order)."""
    array = (KyAttribute * max(1, len(values)))()
    for slot, spec, value in zip(array, primitive.attributes, values):
        if spec.kind == "float":
            slot.float_value = float(value)
            continue
        if not _INT64_RANGE[0] <= int(value) <= _INT64_RANGE[1]:
            raise ValueError(f"{spec.name} of {primitive.name} must fit in int64, got {value}")
        slot.int_value = int(value)
    return array


def _views(views):
    return (KyTensor * max(1, len(views)))(*views)


def _raise_unless_ok(status, error):
    """ValueError with the kernel's message for invalid inputs, RuntimeError for other failures."""
    if status == _OK:
        return
    message = error.value.decode("utf-8", "replace")
    raise (ValueError if status == _INVALID_ARGUMENT else RuntimeError)(message)


def call(name, inputs, attributes, outputs, num_threads=0, native=None):
    """Runs primitive `name` of the table (_spec.PRIMITIVES) through the C ABI's ky_run of `native` (an
    `open_library`; default: the package's): `inputs` and `outputs` KyTensor views and `attributes`
    values, each in the table's order.

    Raises ValueError with the kernel's message for invalid inputs, RuntimeError otherwise.
    """
    primitive = _spec.PRIMITIVES[name]
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    status = (native or library()).ky_run(name.encode(), _views(inputs), len(inputs),
                                          _attributes(primitive, attributes), len(attributes), _views(outputs),
                                          len(outputs), int(num_threads), error, _ERROR_SIZE)
    _raise_unless_ok(status, error)


def build_info():
    """How the loaded library was built (compiler; CUDA runtime and SM architectures), or None."""
    return None if library() is None else library().ky_build_info().decode()


def device_kernels():
    """True when the loaded library holds CUDA kernels (it was built with nvcc)."""
    return library() is not None and bool(library().ky_device_kernels())


def has_device_kernel(name):
    """True when primitive `name` has a CUDA kernel in the loaded library."""
    return library() is not None and bool(library().ky_has_device_kernel(name.encode()))


_GPU_KERNEL_NAMES = {}


def gpu_kernel_names(causal=_spec.BIDIRECTIONAL):
    """The primitives with a GPU kernel in the loaded library for a call in the direction `causal` (empty without
    one; on a GPU only the Triton kernels take causal != 0, so none for such a call where the library embeds no
    cubins), asked once per process and direction: the providers read it while torch.compile or jax.jit trace."""
    directed = bool(causal)
    if directed not in _GPU_KERNEL_NAMES:
        names = frozenset(n for n in _spec.PRIMITIVES if has_device_kernel(n))
        _GPU_KERNEL_NAMES[directed] = names if not directed or triton_cubins() > 0 else frozenset()
    return _GPU_KERNEL_NAMES[directed]


def device_workspace_bytes(name, inputs, attributes):
    """The device workspace in bytes that `call_device` needs for primitive `name` on `inputs` (KyTensor
    views; their data is not read) and `attributes`. ValueError for a call the GPU kernel refuses."""
    primitive = _spec.PRIMITIVES[name]
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    size = _I64(0)
    status = library().ky_device_workspace_bytes(name.encode(), _views(inputs), len(inputs),
                                                 _attributes(primitive, attributes), len(attributes), ctypes.byref(size),
                                                 error, _ERROR_SIZE)
    _raise_unless_ok(status, error)
    return size.value


def triton_cubins():
    """How many Triton cubins the loaded library embeds (0: none, or no library)."""
    return 0 if library() is None else int(library().ky_triton_cubins())


def device_launch_plan(name, inputs, attributes, arch, exact_fp32=True, deterministic=False):
    """The Triton launch plan of primitive `name` on `inputs` (KyTensor views; their data is not read) for the
    cubins of compute capability `arch` (80 or 90), as a dict (custom_ops/cc/kernels/triton_launch.h:
    workspace_bytes, copies, zeroed, launches with variant, grid and args); exact_fp32: IEEE products for fp32
    rows (else TF32); deterministic: the eq. 4 kernels' deterministic mode. Needs no GPU: tests run it in
    Triton's interpreter. ValueError where the Triton kernels cannot take the call."""
    primitive = _spec.PRIMITIVES[name]
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    plan = ctypes.create_string_buffer(1 << 20)
    status = library().ky_device_launch_plan(name.encode(), _views(inputs), len(inputs),
                                             _attributes(primitive, attributes), len(attributes), int(arch),
                                             _PLAN_EXACT_FP32 * bool(exact_fp32) + _PLAN_DETERMINISTIC * bool(deterministic),
                                             plan, len(plan), error, _ERROR_SIZE)
    _raise_unless_ok(status, error)
    return json.loads(plan.value.decode())


def call_device(name, inputs, attributes, outputs, workspace, workspace_bytes, stream):
    """Runs primitive `name` through the C ABI's ky_run_device: `inputs` and `outputs` KyTensor views of
    device memory, the device `workspace` address (at least `device_workspace_bytes`), the CUDA
    `stream` handle (an int; 0: the legacy default stream). The kernels are enqueued on the stream.

    Raises ValueError with the kernel's message for invalid inputs, RuntimeError for a CUDA error or a
    library built without CUDA kernels.
    """
    primitive = _spec.PRIMITIVES[name]
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    status = library().ky_run_device(name.encode(), _views(inputs), len(inputs), _attributes(primitive, attributes),
                                     len(attributes), _views(outputs), len(outputs), workspace, int(workspace_bytes),
                                     stream, error, _ERROR_SIZE)
    _raise_unless_ok(status, error)
