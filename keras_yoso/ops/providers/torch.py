"""The PyTorch provider: the native library's CPU and CUDA kernels as `torch.library` custom ops.

Each primitive is one op of the `keras_yoso::` namespace (`torch.ops.keras_yoso.<name>`) whose
CPU implementation hands contiguous views of its tensors to the C ABI
(custom_ops/cc/c_api/yoso_c_api.h) through `native_library.call`, with as many threads as
`torch.get_num_threads()`; the C ABI checks everything (shapes, dtypes, code ranges, limits) and
its errors arrive as ValueError. Where the library holds a primitive's CUDA kernel, the op has a
CUDA implementation too (`register_kernel("cuda")`): the same views of CUDA tensors through
`native_library.call_device`, on the current CUDA stream, with a workspace from PyTorch's caching
allocator.

Each op has a fake (meta) implementation that gives the output's shape and dtype, so
`torch.compile(fullgraph=True)` traces through it without a graph break.

On a busy machine PyTorch's libgomp workers, which spin for milliseconds after every op, take the
cores from the threads that have work (the native kernels' and PyTorch's own): a training run
took up to 10x its quiet time (docs/benchmarks.md, "A busy machine"). libgomp reads
OMP_WAIT_POLICY once, when PyTorch loads it, so when the provider loads it throttles that
spinning through the native library (`native_library.throttle_openmp_spinning`: libgomp's
workers then spin about 100 times before they sleep, as with OMP_WAIT_POLICY=PASSIVE), for the
libgomp that PyTorch runs its parallel regions on. Elsewhere (another OpenMP runtime, another parallel
backend, no /proc/self/maps) nothing changes. `KERAS_YOSO_TORCH_OPENMP_SPINNING=default` keeps
libgomp's own spinning.

The ops have no autograd formula of their own: the public functions of `keras_yoso.ops` bring
their gradients (`keras.ops.custom_gradient`, a `torch.autograd.Function` on torch), written once
for every provider in ops/yoso.py.
"""

import ctypes
import os

import torch

from keras_yoso.ops import _spec
from keras_yoso.ops.providers import base
from keras_yoso.ops.providers import native_library

_NAMESPACE = "keras_yoso"
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.int32: "int32"}


def _view(tensor, name):
    """A KyTensor over `tensor` (CPU, contiguous); ValueError naming `name` for a dtype the C ABI lacks."""
    dtype = _DTYPE_NAMES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"{name} must be float32, float16, bfloat16 or int32 for the keras_yoso native kernels, "
                         f"got {tensor.dtype}")
    return native_library.tensor_view(tensor.data_ptr(), dtype, tuple(tensor.shape))


def _run(primitive, inputs, attributes, outputs):
    """Runs the primitive named `primitive` through the C ABI on the named `inputs` [(name, tensor)], the attributes and
    the named `outputs`, on the CPU kernels; returns the output tensors."""
    inputs = [(name, tensor.contiguous()) for name, tensor in inputs]  # kept alive until the call returns
    views = [_view(tensor, name) for name, tensor in inputs]
    native_library.call(primitive, views, attributes, [_view(tensor, name) for name, tensor in outputs],
                        num_threads=torch.get_num_threads())
    return [tensor for _, tensor in outputs]


def _run_cuda(primitive, inputs, attributes, outputs):
    """`_run` on the CUDA kernels: CUDA `inputs` and `outputs` of one device, the kernels enqueued on
    that device's current stream with a workspace tensor of the size the C ABI asks for."""
    inputs = [(name, tensor.contiguous()) for name, tensor in inputs]
    views = [_view(tensor, name) for name, tensor in inputs]
    device = outputs[0][1].device
    with torch.cuda.device(device):
        size = native_library.device_workspace_bytes(primitive, views, attributes)
        workspace = torch.empty(max(1, size), dtype=torch.uint8, device=device)
        native_library.call_device(primitive, views, attributes, [_view(tensor, name) for name, tensor in outputs],
                                   workspace.data_ptr(), workspace.numel(), torch.cuda.current_stream(device).cuda_stream)
    return [tensor for _, tensor in outputs]


# Schema types of the table's attribute kinds.
_SCHEMA_TYPES = {"int": "int", "float": "float"}


_DTYPES = {"int32": torch.int32, "float32": torch.float32}


def _outputs(primitive, arguments):
    """Empty output tensors of `primitive` for `arguments` (its inputs, then its attributes)."""
    arguments = primitive.complete(arguments)
    count = len(primitive.inputs)
    tensors = dict(zip(primitive.input_names, arguments[:count]))
    attributes = dict(zip(primitive.attribute_names, arguments[count:]))
    primitive.check_ranks({n: tuple(t.shape) for n, t in tensors.items()})
    shapes = primitive.output_shapes({n: tuple(t.shape) for n, t in tensors.items()}, attributes)
    like = tensors[primitive.input_names[0]]
    return [torch.empty(shape, dtype=tensors[out.dtype].dtype if out.dtype in tensors else _DTYPES[out.dtype],
                        device=like.device) for out, shape in zip(primitive.outputs, shapes)]


def _returned(outputs):
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _define(primitive):
    """Registers `keras_yoso::<name>`: its CPU implementation runs the primitive through the C ABI, its CUDA one (where
    the library has the primitive's CUDA kernel) through the C ABI's device entry, its fake gives the output's shape
    and dtype (so torch.compile traces it without a graph break)."""
    count = len(primitive.inputs)
    schema = ", ".join([f"Tensor {name}" for name in primitive.input_names]
                       + [f"{_SCHEMA_TYPES[a.kind]} {a.name}" + ("" if a.default is None else f"={a.default}")
                          for a in primitive.attributes])

    returns = "Tensor" if len(primitive.outputs) == 1 else "(" + ", ".join(["Tensor"] * len(primitive.outputs)) + ")"

    def implementation(run):
        def run_primitive(*arguments):
            arguments = primitive.complete(arguments)
            inputs = list(zip(primitive.input_names, arguments[:count]))
            outputs = list(zip([o.name for o in primitive.outputs], _outputs(primitive, arguments)))
            return _returned(run(primitive.name, inputs, list(arguments[count:]), outputs))

        return run_primitive

    op = torch.library.custom_op(f"{_NAMESPACE}::{primitive.name}", implementation(_run), mutates_args=(),
                                 device_types="cpu", schema=f"({schema}) -> {returns}")
    op.register_fake(lambda *arguments: _returned(_outputs(primitive, arguments)))
    if native_library.has_device_kernel(primitive.name):
        op.register_kernel("cuda")(implementation(_run_cuda))


def _loaded_libgomp_paths():
    """Paths of the libgomp files mapped into this process (none where /proc/self/maps is missing)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            fields = [line.split(maxsplit=5) for line in maps]
    except OSError:
        return []
    paths = (f[5].strip() for f in fields if len(f) == 6)
    return list(dict.fromkeys(p for p in paths if os.path.basename(p).startswith("libgomp")))


def _function_address(path, name):
    """The address of function `name` in the already loaded library `path` or, as dlsym searches, in
    the libraries it depends on; None when there is none."""
    try:
        return ctypes.cast(getattr(ctypes.CDLL(path, mode=os.RTLD_NOLOAD), name), ctypes.c_void_p).value
    except (OSError, AttributeError):  # not loaded, no such symbol, or no RTLD_NOLOAD (Windows)
        return None


def torch_openmp_parallel_region():
    """The address of `GOMP_parallel` in the libgomp that PyTorch runs its intra-op parallel regions
    on, or None: PyTorch's parallel backend is not OpenMP, its OpenMP runtime is not libgomp (Intel's,
    LLVM's), or the loaded libraries cannot be listed."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    region = _function_address(torch._C.__file__, "GOMP_parallel")  # the one torch's libraries call
    if region is None or all(_function_address(p, "GOMP_parallel") != region for p in _loaded_libgomp_paths()):
        return None
    return region


_THROTTLED = False


def _throttle_torch_openmp_spinning():
    """Once per process: throttles the spinning of PyTorch's libgomp workers (module docstring), unless
    KERAS_YOSO_TORCH_OPENMP_SPINNING=default or PyTorch runs on no libgomp."""
    global _THROTTLED
    if _THROTTLED:
        return
    _THROTTLED = True
    if os.environ.get("KERAS_YOSO_TORCH_OPENMP_SPINNING", "throttled") == "default":
        return
    region = torch_openmp_parallel_region()  # reads /proc/self/maps: only when it will be used
    if region is not None:
        native_library.throttle_openmp_spinning(region, len(os.sched_getaffinity(0)))


def _torch_load_error():
    if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_fake"):
        return f"torch {torch.__version__} has no torch.library.custom_op (keras_yoso needs torch >= 2.4)"
    return None


# The devices the ops have kernels for: set when they are registered.
_DEVICES = ("cpu",)


def _register_ops():
    """Defines the `keras_yoso::` ops of `_spec.PRIMITIVES` once per process: a second import of this
    module (a reload) finds them registered and uses them as they are."""
    global _DEVICES
    for primitive in _spec.PRIMITIVES.values():
        if not hasattr(getattr(torch.ops, _NAMESPACE), primitive.name):
            _define(primitive)
    _DEVICES = ("cpu", "gpu") if native_library.device_kernels() else ("cpu",)
    for causal in (_spec.BIDIRECTIONAL, _spec.CAUSAL):  # asked now, read while torch.compile traces
        native_library.gpu_kernel_names(causal)


def _op(name):
    """The registered op `torch.ops.keras_yoso.<name>.default`."""
    return getattr(getattr(torch.ops, _NAMESPACE), name).default


class TorchProvider(base.NativeLibraryProvider):
    """The native library's kernels as torch.library ops: traced by torch.compile, CPU tensors and, where the
    library holds CUDA kernels, CUDA tensors."""

    def load_error(self):
        error = _torch_load_error() or native_library.load_error()
        if error is None:
            _throttle_torch_openmp_spinning()
        return error

    def device_of(self, tensors):
        """"gpu" when a tensor among `tensors` is a CUDA tensor, the device type of another one off the CPU
        (e.g. "mps", "meta"), else "cpu"."""
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
                return {"cuda": "gpu"}.get(tensor.device.type, tensor.device.type)
        return "cpu"

    def devices(self):
        return _DEVICES  # read, not computed: torch.compile traces this without calling the library

    def run(self, name, *arguments):
        """`_spec.PRIMITIVES[name]` as its `torch.ops.keras_yoso` op; masks (and the other float32
        inputs) as float32, attributes as Python numbers."""
        primitive = _spec.PRIMITIVES[name]
        count = len(primitive.inputs)
        tensors = [t.to(torch.float32) if spec.dtype == "float32" else t
                   for spec, t in zip(primitive.inputs, arguments[:count])]
        attributes = [int(a) if spec.kind == "int" else float(a)
                      for spec, a in zip(primitive.attributes, arguments[count:])]
        return _op(name)(*tensors, *attributes)


PROVIDER = TorchProvider()

if _torch_load_error() is None:
    _register_ops()
