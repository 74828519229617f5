"""The JAX provider: the native library's CPU kernels as XLA FFI custom calls.

A thin layer: each primitive is one `jax.ffi.ffi_call` of a handler of
custom_ops/cc/jax/yoso_xla_ffi.cc, which hands the buffers to the C ABI
(custom_ops/cc/c_api/yoso_c_api.h); the C ABI checks every input (shapes, dtypes, codes in
[0, num_buckets), the per-bucket table limit) and runs the kernel on the library's own thread
pool. The calls are ordinary XLA ops: they run eagerly, inside `jax.jit`, and under `jax.vmap`
(`vmap_method="broadcast_all"`: the handlers loop over the extra leading dims). Gradients come
from `keras_yoso.ops` (`keras.ops.custom_gradient`), as for every provider.

Errors: an input the kernel rejects raises, in eager mode, ValueError with the kernel's message
(e.g. "query_codes has 3 codes outside [0, num_buckets) = [0, 16)"). Inside `jax.jit` the
kernel runs when the compiled function runs, and the error is whatever JAX raises for a failed
custom call at that point (jax 0.10: jax.errors.JaxRuntimeError, a RuntimeError,
"INVALID_ARGUMENT: <the kernel's message>"; older jax: XlaRuntimeError).

CPU only: `device_error` names the device when JAX computes elsewhere, so "auto" takes the
composite there and "custom_op" raises.
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
    """Registers the handlers as XLA FFI targets for the CPU, once. Returns "" or why not."""
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

    def device_error(self, tensors, causal=0):
        """A message naming the device when an input lives off the CPU or JAX computes on another
        backend (the kernels run on CPU only); else None."""
        for tensor in tensors:
            if isinstance(tensor, jax.Array) and not isinstance(tensor, jax.core.Tracer):
                devices = [d for d in tensor.devices() if d.platform != "cpu"]
                if devices:
                    return (f"the keras_yoso native kernels run on CPU only; the inputs are on {devices[0]} "
                            "(use implementation='composite' or 'auto' there)")
        backend = jax.default_backend()
        if backend != "cpu":
            return (f"the keras_yoso native kernels run on CPU only; JAX computes on {backend} "
                    f"({jax.devices()[0]}) (use implementation='composite' or 'auto' there)")
        return None

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
