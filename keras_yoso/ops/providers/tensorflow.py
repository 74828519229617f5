"""The TensorFlow provider: the C++/CUDA kernels of the TensorFlow op library.

A thin layer: each primitive calls one raw op (`custom_ops/cc/tf/yoso_ops.cc`), whose kernels
check their own inputs (custom_ops/cc/kernels/yoso_checks.h). The raw ops' gradients are
registered here too, so graphs and SavedModels that call them directly (and `tf.GradientTape`
over them) differentiate; the public functions of `keras_yoso.ops` bring their own gradients
(`keras.ops.custom_gradient`).

The op library is loaded when keras_yoso is imported on TensorFlow (not lazily), so SavedModels
that contain its ops load afterwards. If it is missing or fails to load (e.g. an ABI mismatch
after a TensorFlow upgrade), one warning says why, how to rebuild, and what the composite fallback
costs, and every op runs on the composite instead.

Devices: a call runs on the GPU when one is visible and no device scope names the CPU
(`device_of`); the op library has GPU kernels when it was built with nvcc (`devices`), for the
primitives whose `_spec` row lists "gpu" (causal = 0 only). Elsewhere "auto" takes the composite
and "custom_op" raises, naming the primitive and the device.
"""

import functools


import tensorflow as tf
from tensorflow.python.eager import context as tf_context
from tensorflow.python.framework import config as tf_config
from tensorflow.python.framework import kernels as tf_kernels

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops import _spec
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


@functools.lru_cache(maxsize=None)
def _library_devices():
    """("cpu",), plus "gpu" when the op library registered its CUDA kernels (built with nvcc)."""
    registered = tf_kernels.get_registered_kernels_for_op(_spec.PRIMITIVES["lsh_cumulation"].raw_op).kernel
    return ("cpu", "gpu") if any(k.device_type == "GPU" for k in registered) else ("cpu",)


def _raw_op(primitive):
    """The op library's Python function of `primitive`'s raw op."""
    return getattr(library(), primitive.raw_op_function)


class TensorFlowProvider(base.Provider):
    """The TensorFlow op library: not an XLA op (so no jit_compile), CPU and GPU kernels."""

    name = "custom_op"
    checks_codes = True
    needs_static_num_hashes = False
    max_bucket_table_floats = _validation.MAX_BUCKET_TABLE_FLOATS
    supports_jit = False

    def load_error(self):
        return load_error()

    def usable_here(self):
        """False inside XLA-compiled graphs (no XLA kernels) and where determinism needs the composite."""
        return not _backend.in_xla_context() and not _gpu_needs_determinism()

    def device_of(self, tensors):
        """"gpu" where TensorFlow would place the call on a GPU (a GPU is visible and no device scope
        names the CPU), else "cpu"."""
        return "gpu" if _runs_on_gpu() else "cpu"

    def devices(self):
        return _library_devices()

    def builds_gpu_kernel(self, name, causal=_spec.BIDIRECTIONAL):
        """The op library is built beside the native library, with the same Triton cubins: the native
        library says which GPU kernels the build holds (where it loads; a causal call, which only the Triton
        kernels take on a GPU, needs it to say so)."""
        if native_library.library() is None:
            return not causal
        return name in native_library.gpu_kernel_names(causal)

    def run(self, name, *arguments):
        """`_spec.PRIMITIVES[name]` as one call of its raw op: masks, codes and parameters in the
        table's dtypes, the float rows in the primitive's (its source input's, which must be a float:
        else ValueError naming it), the attributes and the raw op's own selectors as attrs."""
        primitive = _spec.PRIMITIVES[name]
        count = len(primitive.inputs)
        named = dict(zip(primitive.input_names, (tf.convert_to_tensor(t) for t in arguments[:count])))
        source = primitive.float_dtype_source() or primitive.input_names[0]
        dtype = named[source].dtype
        if dtype not in (tf.float32, tf.float16, tf.bfloat16):
            raise ValueError(f"{source} must be float32, float16 or bfloat16 for the keras_yoso op library, got "
                             f"{dtype.name}")
        tensors = [tf.cast(t, spec.dtype or dtype) for spec, t in zip(primitive.inputs, named.values())]
        attributes = dict(zip(primitive.attribute_names, arguments[count:]))
        result = _raw_op(primitive)(*tensors, **attributes, **primitive.raw_op_attributes)
        return result if len(primitive.outputs) == 1 else tuple(result)


PROVIDER = TensorFlowProvider()


def _register_gradients():
    """Gradients of the raw ops, for graphs that call them directly: the provider's cumulation
    gradients (providers/base.py), as ops/yoso.py's custom gradients take them."""

    def _causal(op):
        """The op's causal attr, a direction (BIDIRECTIONAL for graphs built before it existed)."""
        try:
            return op.get_attr("causal")
        except ValueError:
            return _spec.BIDIRECTIONAL

    @tf.RegisterGradient("YosoLshCumulation")
    def _lsh_cumulation_grad(op, dy):
        qm, qc, km, kc, value = op.inputs
        dv = PROVIDER.lsh_cumulation_gradient(qm, qc, km, kc, tf.cast(dy, value.dtype), op.get_attr("num_buckets"),
                                              _causal(op))
        return [None, None, None, None, dv]

    @tf.RegisterGradient("YosoWeightedLshCumulation")
    def _weighted_lsh_cumulation_grad(op, dy):
        qm, qc, qw, km, kc, kw, value = op.inputs
        d_qw, d_kw, d_value = PROVIDER.weighted_lsh_cumulation_gradients(
            qm, qc, qw, km, kc, kw, value, tf.cast(dy, value.dtype), op.get_attr("num_buckets"), _causal(op))
        return [None, None, d_qw, None, None, d_kw, d_value]

    @tf.RegisterGradient("YosoLowerBoundGradients")
    def _lower_bound_gradients_grad(op, d_query_gradient, d_key_gradient):
        # The op is the two weighted cumulations W(qm, qc, dY, km, kc, V, K) and W(km, kc, V, qm, qc, dY, Q):
        # the sum of their gradients.
        qm, qc, query, km, kc, key, value, dy = op.inputs
        num_buckets, causal = op.get_attr("num_buckets"), _causal(op)
        d_dy, d_value, d_key = PROVIDER.weighted_lsh_cumulation_gradients(
            qm, qc, dy, km, kc, value, key, tf.cast(d_query_gradient, dy.dtype), num_buckets, causal)
        d_value_2, d_dy_2, d_query = PROVIDER.weighted_lsh_cumulation_gradients(
            km, kc, value, qm, qc, dy, query, tf.cast(d_key_gradient, dy.dtype), num_buckets,
            _spec.transposed_direction(causal))
        return [None, None, d_query, None, None, d_key, d_value + d_value_2, d_dy + d_dy_2]

    for name in ("YosoGaussianHashCodes", "YosoHadamardHashCodes", "YosoCollisionCumulation"):
        tf.no_gradient(name)


if library() is not None:
    _register_gradients()
