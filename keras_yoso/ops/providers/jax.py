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

from keras_yoso.ops.providers import base
from keras_yoso.ops.providers import native_library

# XLA FFI target name -> handler symbol exported by the native library.
_TARGETS = {
    "keras_yoso_gaussian_hash_codes": "ky_xla_gaussian_hash_codes",
    "keras_yoso_hadamard_hash_codes": "ky_xla_hadamard_hash_codes",
    "keras_yoso_hadamard_interleaved_hash_codes": "ky_xla_hadamard_interleaved_hash_codes",
    "keras_yoso_lsh_cumulation": "ky_xla_lsh_cumulation",
    "keras_yoso_weighted_lsh_cumulation": "ky_xla_weighted_lsh_cumulation",
    "keras_yoso_collision_cumulation": "ky_xla_collision_cumulation",
}
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
    missing = [symbol for symbol in _TARGETS.values() if not native_library.has_handler(symbol)]
    if missing:
        return (f"the keras_yoso native library has no XLA FFI handlers ({', '.join(missing)}): it was built "
                f"without jaxlib's XLA FFI headers. {native_library.REBUILD_HINT}")
    try:
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(native_library.handler(symbol)), platform="cpu")
    except Exception as exception:  # noqa: BLE001: any failure means "not usable", with its reason
        return f"registering the keras_yoso XLA FFI handlers failed: {exception}"
    return ""


def _is_traced(arrays):
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _call(target, result, arrays, **attributes):
    """One FFI call of `target` on `arrays`, with `result` (a jax.ShapeDtypeStruct) and `attributes`
    typed as the handler declares them. In eager mode a kernel's InvalidArgument becomes
    ValueError with the kernel's message."""
    run = jax.ffi.ffi_call(target, result, vmap_method="broadcast_all")
    if _is_traced(arrays):
        return run(*arrays, **attributes)
    try:
        return run(*arrays, **attributes).block_until_ready()
    except _RUNTIME_ERRORS as error:
        message = str(error)
        if not message.startswith(_INVALID_ARGUMENT_PREFIX):
            raise
        raise ValueError(message[len(_INVALID_ARGUMENT_PREFIX):]) from None


def _mask(mask):
    return jnp.asarray(mask).astype(jnp.float32)


def _codes(codes):
    return jnp.asarray(codes).astype(jnp.int32)


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

    def hash_codes(self, x, params, num_hashes, hash_code_len, method):
        """Sign-random-projection codes (YOSO §3.2, appendix §1.2): x `[B, N, d]` float, params
        float32 (gaussian: projection `[d, m * tau]`; the Hadamard methods: signs `[num_blocks, 3, padded_dim]`)
        -> int32 `[B, m, N]`, code = sum_i [<x, r_{h,i}> > 0] 2^i. Piecewise constant: its
        inputs are cut from autodiff (an FFI call has no derivative rule), so layers that hash
        projected queries and keys differentiate through it, as through the composite."""
        _register()
        x = jax.lax.stop_gradient(jnp.asarray(x))
        params = jax.lax.stop_gradient(jnp.asarray(params, jnp.float32))
        target = f"keras_yoso_{method}_hash_codes"
        result = jax.ShapeDtypeStruct((x.shape[0], num_hashes, x.shape[1]), jnp.int32)
        return _call(target, result, (x, params), num_hashes=np.int64(num_hashes),
                     hash_code_len=np.int64(hash_code_len), num_threads=_threads())

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        """YOSO eq. 2 averaged over the m hashes: out[b, i] = qmask (1/m) sum_h sum_j kmask
        [qc[b,h,i] == kc[b,h,j]] value[b, j], over keys j <= i (causal=1) or j >= i (causal=-1;
        Nq == Nk when causal != 0). codes `[B, m, N]`, value `[B, Nk, D]` -> `[B, Nq, D]` in
        value's dtype."""
        _register()
        query_codes, key_codes, value = _codes(query_codes), _codes(key_codes), jnp.asarray(value)
        result = jax.ShapeDtypeStruct((query_codes.shape[0], query_codes.shape[2], value.shape[2]), value.dtype)
        return _call("keras_yoso_lsh_cumulation", result,
                     (_mask(query_mask), query_codes, _mask(key_mask), key_codes, value),
                     num_buckets=np.int64(num_buckets), causal=np.int64(causal), num_threads=_threads())

    def weighted_lsh_cumulation(self, query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                query_mask, key_mask, causal=0):
        """lsh_cumulation with each colliding pair weighted by <query_weight_i, key_weight_j> (the
        blocks of the eq. 4 backward), causal as there. query_weight `[B, Nq, W]`, key_weight
        `[B, Nk, W]`, value `[B, Nk, D]` -> `[B, Nq, D]` in value's dtype (the weights are cast to
        it)."""
        _register()
        query_codes, key_codes, value = _codes(query_codes), _codes(key_codes), jnp.asarray(value)
        query_weight = jnp.asarray(query_weight).astype(value.dtype)
        key_weight = jnp.asarray(key_weight).astype(value.dtype)
        result = jax.ShapeDtypeStruct((query_codes.shape[0], query_codes.shape[2], value.shape[2]), value.dtype)
        return _call("keras_yoso_weighted_lsh_cumulation", result,
                     (_mask(query_mask), query_codes, query_weight, _mask(key_mask), key_codes, key_weight, value),
                     num_buckets=np.int64(num_buckets), causal=np.int64(causal), num_threads=_threads())

    def collision_cumulation(self, query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len,
                             epsilon, query_mask, key_mask):
        """The *YOSO estimator (appendix eq. 2 on colliding pairs): sum_j w_ij key_j over keys
        colliding with query i in >= 1 hash, each pair once, w_ij = <query_weight_i, key_weight_j>
        tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + epsilon)), x = <query_i, key_j> clipped
        to [-1, 1]. query `[B, Nq, d]`, key `[B, Nk, d]`, weights `[B, N, W]` -> `[B, Nq, d]` in
        query's dtype (the others are cast to it)."""
        _register()
        query_codes, key_codes, query = _codes(query_codes), _codes(key_codes), jnp.asarray(query)
        dtype = query.dtype
        query_weight, key, key_weight = (jnp.asarray(t).astype(dtype) for t in (query_weight, key, key_weight))
        result = jax.ShapeDtypeStruct((query_codes.shape[0], query_codes.shape[2], query.shape[2]), dtype)
        return _call("keras_yoso_collision_cumulation", result,
                     (_mask(query_mask), query_codes, query, query_weight, _mask(key_mask), key_codes, key,
                      key_weight),
                     hash_code_len=np.int64(hash_code_len), epsilon=np.float32(epsilon), num_threads=_threads())


PROVIDER = JaxProvider()
