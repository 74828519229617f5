"""The TensorFlow provider: the C++/CUDA kernels of the TensorFlow op library.

A thin layer: each primitive calls one raw op (`custom_ops/cc/ops/yoso_ops.cc`), whose kernels
check their own inputs (custom_ops/cc/kernels/yoso_checks.h). The raw ops' gradients are
registered here too, so graphs and SavedModels that call them directly (and `tf.GradientTape`
over them) differentiate; the public functions of `keras_yoso.ops` bring their own gradients
(`keras.ops.custom_gradient`).

The op library is loaded when keras_yoso is imported on TensorFlow (not lazily), so SavedModels
that contain its ops load afterwards. If it is missing or fails to load (e.g. an ABI mismatch
after a TensorFlow upgrade), one warning says why, how to rebuild, and what the composite fallback
costs, and every op runs on the composite instead.

The causal cumulations (`causal` != 0) have CPU kernels only: `device_error` names the GPU for a
causal call that TensorFlow would place there, so "auto" takes the composite and "custom_op" raises.
"""

import tensorflow as tf
from tensorflow.python.eager import context as tf_context
from tensorflow.python.framework import config as tf_config

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops.providers import base
from keras_yoso.ops.providers import native_library

_REBUILD_HINT = (
    "Rebuild it against the installed TensorFlow with "
    "`pip install --force-reinstall --no-deps --no-build-isolation .` from the keras-yoso source tree. "
    "Until then keras_yoso runs every op on its keras.ops composite: the same numbers, but slower and "
    "bigger on long sequences: one YosoAttention layer (4 heads x 64, m = 32, tau = 8) forward+backward "
    "at 4096 tokens on a 2-core CPU took 2.2 s and 1.3 GiB on the composite against 0.39 s and 0.9 GiB "
    "with the custom op (docs/benchmarks.md, 'Composite vs custom op')."
)


# tf raises NotFoundError and others for undefined symbols: any exception means "not loadable".
_LIBRARY = native_library.LazyLibrary("custom ops", "_yoso_ops*.so", "compiled library", tf.load_op_library,
                                      (Exception,), _REBUILD_HINT, stacklevel=4)
library = _LIBRARY.library  # the loaded op library module, or None when only the composite runs
load_error = _LIBRARY.load_error  # why the library is not loaded (None when it is)


def _gpu_needs_determinism():
    """Under `enable_op_determinism()` with a GPU visible the GPU table cumulations (float atomics)
    raise UnimplementedError: "auto" then takes the deterministic composite."""
    return tf_config.is_op_determinism_enabled() and bool(tf.config.list_physical_devices("GPU"))


def _runs_on_gpu():
    """True when an op created here would run on a GPU: a GPU is visible and the current device
    scope (eager or while a tf.function is traced) does not name the CPU. With no scope TensorFlow
    places an op that has a GPU kernel on the GPU, wherever its inputs are."""
    if not tf.config.list_physical_devices("GPU"):
        return False
    return "CPU" not in (tf_context.context().device_name or "").upper()


def _mask(mask):
    return tf.cast(mask, tf.float32)


def _lib():
    return library()


class TensorFlowProvider(base.Provider):
    """The TensorFlow op library: not an XLA op (so no jit_compile), CPU and GPU kernels."""

    checks_codes = True
    needs_static_num_hashes = False
    max_bucket_table_floats = _validation.MAX_BUCKET_TABLE_FLOATS
    supports_jit = False

    def load_error(self):
        return load_error()

    def usable_here(self):
        """False inside XLA-compiled graphs (no XLA kernels) and where determinism needs the composite."""
        return not _backend.in_xla_context() and not _gpu_needs_determinism()

    def device_error(self, tensors, causal=0):
        """The causal cumulations have CPU kernels only: a message naming the GPU when a causal call
        would run there (TensorFlow places an op on the GPU unless a device scope names the CPU)."""
        if causal and _runs_on_gpu():
            return ("the causal cumulations of the keras_yoso op library have CPU kernels only, and this call "
                    "would run on a GPU (use implementation='auto' or 'composite', or a tf.device('/CPU:0') scope)")
        return None

    def hash_codes(self, x, params, num_hashes, hash_code_len, method):
        if method == "gaussian":
            return _lib().yoso_gaussian_hash_codes(x, params, num_hashes=num_hashes, hash_code_len=hash_code_len)
        return _lib().yoso_hadamard_hash_codes(x, params, num_hashes=num_hashes, hash_code_len=hash_code_len,
                                               interleaved=method == "hadamard_interleaved")

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        return _lib().yoso_lsh_cumulation(_mask(query_mask), query_codes, _mask(key_mask), key_codes, value,
                                          num_buckets=num_buckets, causal=int(causal))

    def weighted_lsh_cumulation(self, query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                query_mask, key_mask, causal=0):
        return _lib().yoso_weighted_lsh_cumulation(_mask(query_mask), query_codes, query_weight, _mask(key_mask),
                                                   key_codes, key_weight, value, num_buckets=num_buckets,
                                                   causal=int(causal))

    def collision_cumulation(self, query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len,
                             epsilon, query_mask, key_mask):
        return _lib().yoso_collision_cumulation(_mask(query_mask), query_codes, query, query_weight,
                                                _mask(key_mask), key_codes, key, key_weight,
                                                hash_code_len=hash_code_len, epsilon=epsilon)


PROVIDER = TensorFlowProvider()


def _register_gradients():
    """Gradients of the raw ops, for graphs that call them directly: the role swaps of ops/yoso.py's
    custom gradients, in the raw ops' input order."""

    def _causal(op):
        """The op's causal attr (0 for graphs built before it existed); the transposed cumulations,
        which sum over the queries of a key, run in the opposite direction (-causal)."""
        try:
            return op.get_attr("causal")
        except ValueError:
            return 0

    @tf.RegisterGradient("YosoLshCumulation")
    def _lsh_cumulation_grad(op, dy):
        qm, qc, km, kc, value = op.inputs
        dv = _lib().yoso_lsh_cumulation(km, kc, qm, qc, tf.cast(dy, value.dtype),
                                        num_buckets=op.get_attr("num_buckets"), causal=-_causal(op))
        return [None, None, None, None, dv]

    @tf.RegisterGradient("YosoWeightedLshCumulation")
    def _weighted_lsh_cumulation_grad(op, dy):
        qm, qc, qw, km, kc, kw, value = op.inputs
        nb, causal = op.get_attr("num_buckets"), _causal(op)
        run = _lib().yoso_weighted_lsh_cumulation
        dy = tf.cast(dy, value.dtype)
        d_qw = run(qm, qc, dy, km, kc, value, kw, num_buckets=nb, causal=causal)
        d_kw = run(km, kc, value, qm, qc, dy, qw, num_buckets=nb, causal=-causal)
        d_value = run(km, kc, kw, qm, qc, qw, dy, num_buckets=nb, causal=-causal)
        return [None, None, d_qw, None, None, d_kw, d_value]

    for name in ("YosoGaussianHashCodes", "YosoHadamardHashCodes", "YosoCollisionCumulation"):
        tf.no_gradient(name)


if library() is not None:
    _register_gradients()
