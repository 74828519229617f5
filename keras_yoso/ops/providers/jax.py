"""The JAX provider: the native library's CPU and CUDA kernels as XLA FFI custom calls.

A thin layer: each primitive is one `jax.ffi.ffi_call` of a handler of
custom_ops/cc/jax/yoso_xla_ffi.cc, which hands the buffers to the C ABI
(custom_ops/cc/c_api/yoso_c_api.h); the C ABI checks every input (shapes, dtypes, codes in
[0, num_buckets), the per-bucket table limit) and runs the kernel: on the CPU on the library's own
thread pool, on a GPU on XLA's stream with XLA's scratch memory. Each target name is registered for
platform "cpu" and, for the primitives the library has CUDA kernels for, "CUDA": XLA picks the
handler of the platform it compiles for. The calls are ordinary XLA ops: they run eagerly, inside `jax.jit`, and under `jax.vmap`
(`vmap_method="broadcast_all"`: the handlers loop over the extra leading dims). Gradients come
from `keras_yoso.ops` (`keras.ops.custom_gradient`), as for every provider.

Errors: an input the kernel rejects raises, in eager mode, ValueError with the kernel's message
(e.g. "query_codes has 3 codes outside [0, num_buckets) = [0, 16)"). Inside `jax.jit` the
kernel runs when the compiled function runs, and the error is whatever JAX raises for a failed
custom call at that point (jax 0.10: jax.errors.JaxRuntimeError, a RuntimeError,
"INVALID_ARGUMENT: <the kernel's message>"; older jax: XlaRuntimeError).

Devices: a call runs where its arrays live, or on JAX's default backend while tracing
(`device_of`); "gpu" is served when the library has CUDA kernels and this jax has a CUDA backend
(`devices`). Elsewhere (TPU, ROCm, a primitive without a CUDA kernel, a causal call on a GPU)
"auto" takes the composite and "custom_op" raises, naming the device.
"""

import threading

import jax
import jax.numpy as jnp
import numpy as np

from keras_yoso.ops import _spec
from keras_yoso.ops.providers import base
from keras_yoso.ops.providers import native_library

# The XLA types of the table's attribute kinds (the handlers bind int64 and float32 attributes).
_ATTRIBUTE_TYPES = {"int": np.int64, "float": np.float32}
# Threads of the kernels' pool per call (0: every core); an XLA attribute, fixed when a
# function is traced.
_NUM_THREADS = 0
# What XLA puts before the message of a handler's InvalidArgument error.
_INVALID_ARGUMENT_PREFIX = "INVALID_ARGUMENT: "
# The exceptions a failed custom call raises: ValueError for InvalidArgument (jax >= 0.5),
# JaxRuntimeError (or XlaRuntimeError) otherwise.
_RUNTIME_ERRORS = (ValueError, getattr(jax.errors, "JaxRuntimeError", RuntimeError))

_lock = threading.Lock()
_registration = None  # None until tried; then "" (registered) or why not


def _register():
    """Registers the handlers as XLA FFI targets for the CPU (and CUDA, `_register_cuda`), once.
    Returns "" or why not."""
    global _registration
    if _registration is not None:
        return _registration
    with _lock:
        if _registration is not None:
            return _registration
        _registration = _registration_error()
        return _registration


def _registration_error():
    error = native_library.load_error()
    if error:
        return f"the keras_yoso native library did not load: {error}"
    if not hasattr(getattr(jax, "ffi", None), "ffi_call"):
        return (f"jax {jax.__version__} has no jax.ffi.ffi_call; the keras_yoso native kernels need "
                "jax >= 0.4.38")
    missing = [p.handler for p in _spec.PRIMITIVES.values() if not native_library.has_handler(p.handler)]
    if missing:
        return (f"the keras_yoso native library has no XLA FFI handlers ({', '.join(missing)}): it was built "
                f"without jaxlib's XLA FFI headers. {native_library.REBUILD_HINT}")
    try:
        for primitive in _spec.PRIMITIVES.values():
            capsule = jax.ffi.pycapsule(native_library.handler(primitive.handler))
            jax.ffi.register_ffi_target(primitive.target, capsule, platform="cpu")
    except Exception as exception:  # noqa: BLE001: any failure means "not usable", with its reason
        return f"registering the keras_yoso XLA FFI handlers failed: {exception}"
    global _cuda_registration
    _cuda_registration = _register_cuda()
    return ""


_cuda_registration = None  # None until the CPU handlers are registered; then "" (registered) or why not


def _cuda_backend():
    """True when this jax has a CUDA backend with devices."""
    try:
        return any(d.platform == "gpu" for d in jax.devices("gpu"))
    except RuntimeError:  # no GPU backend
        return False


def _register_cuda():
    """Registers the CUDA handlers of the primitives with a CUDA kernel, under the CPU handlers' target
    names, platform "CUDA". Returns "" or why the GPU is not served."""
    if not native_library.device_kernels():
        return "the keras_yoso native library was built without CUDA kernels"
    if not _cuda_backend():
        return "this jax has no CUDA backend"
    try:
        for primitive in _spec.PRIMITIVES.values():
            if native_library.has_device_kernel(primitive.name):
                capsule = jax.ffi.pycapsule(native_library.handler(primitive.cuda_handler))
                jax.ffi.register_ffi_target(primitive.target, capsule, platform="CUDA")
    except Exception as exception:  # noqa: BLE001: any failure means "not usable", with its reason
        return f"registering the keras_yoso XLA FFI CUDA handlers failed: {exception}"
    return ""


def _is_traced(arrays):
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _call(target, result, arrays, aliases, **attributes):
    """One FFI call of `target` on `arrays`, with `result` (a jax.ShapeDtypeStruct, or a list of them),
    `aliases` (input index -> output index that may reuse its buffer) and `attributes` typed as the
    handler declares them. In eager mode a kernel's InvalidArgument becomes ValueError with the
    kernel's message."""
    run = jax.ffi.ffi_call(target, result, vmap_method="broadcast_all", input_output_aliases=aliases or None)
    if _is_traced(arrays):
        return run(*arrays, **attributes)
    try:
        return jax.block_until_ready(run(*arrays, **attributes))
    except _RUNTIME_ERRORS as error:
        message = str(error)
        if not message.startswith(_INVALID_ARGUMENT_PREFIX):
            raise
        raise ValueError(message[len(_INVALID_ARGUMENT_PREFIX):]) from None


def _threads():
    return np.int64(_NUM_THREADS)


class JaxProvider(base.NativeLibraryProvider):
    """The native library's CPU kernels as XLA FFI custom calls: eager, `jax.jit` and `jax.vmap`;
    bitwise reproducible (each output element is summed in a fixed order)."""

    def load_error(self):
        """None when the handlers are registered, else why not: the native library did not load,
        it was built without the XLA FFI handlers, or this jax has no `jax.ffi`."""
        return _register() or None

    def device_of(self, tensors):
        """While tracing (a tracer among `tensors`) or for no JAX array, JAX's default backend ("cpu",
        "gpu", "tpu", ...); else the platform of the first array that lives off the CPU, or "cpu"."""
        if _is_traced(tensors):
            return jax.default_backend()
        concrete = [t for t in tensors if isinstance(t, jax.Array)]
        for tensor in concrete:
            for device in tensor.devices():
                if device.platform != "cpu":
                    return device.platform
        return "cpu" if concrete else jax.default_backend()

    def devices(self):
        """("cpu",), plus "gpu" when the CUDA handlers are registered."""
        return ("cpu", "gpu") if not _register() and _cuda_registration == "" else ("cpu",)

    def run(self, name, *arguments):
        """`_spec.PRIMITIVES[name]` as one FFI call of its handler: masks as float32, codes as int32,
        the float rows in the output's dtype (the primitive's; hashing keeps x's), float32
        parameters; int attributes as int64, float ones as float32. The hashing primitives are
        piecewise constant: their inputs are cut from autodiff (an FFI call has no derivative rule),
        so layers that hash projected queries and keys differentiate through them, as through the
        composite."""
        _register()
        primitive = _spec.PRIMITIVES[name]
        count = len(primitive.inputs)
        tensors = dict(zip(primitive.input_names, (jnp.asarray(a) for a in arguments[:count])))
        attributes = dict(zip(primitive.attribute_names, arguments[count:]))
        source = primitive.float_dtype_source()
        arrays = []
        for spec in primitive.inputs:
            tensor = tensors[spec.name]
            if spec.dtype is not None:
                tensor = tensor.astype(spec.dtype)
            elif source is not None:
                tensor = tensor.astype(tensors[source].dtype)
            arrays.append(jax.lax.stop_gradient(tensor) if source is None else tensor)
        input_shapes = {n: t.shape for n, t in tensors.items()}
        primitive.check_ranks(input_shapes)
        shapes = primitive.output_shapes(input_shapes, attributes)
        results = [jax.ShapeDtypeStruct(shape, tensors[out.dtype].dtype if out.dtype in tensors else out.dtype)
                   for out, shape in zip(primitive.outputs, shapes)]
        aliases = {primitive.input_names.index(i): [o.name for o in primitive.outputs].index(out)
                   for i, out in primitive.in_place.items()}
        typed = {a.name: _ATTRIBUTE_TYPES[a.kind](attributes[a.name]) for a in primitive.attributes}
        result = _call(primitive.target, results[0] if len(results) == 1 else results, arrays, aliases, **typed,
                       num_threads=_threads())
        return result if len(results) == 1 else tuple(result)


PROVIDER = JaxProvider()
