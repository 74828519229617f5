"""The TensorFlow custom-op provider: the C++/CUDA kernels behind the primitives of `composite`.

A thin layer: each primitive calls one raw op (`custom_ops/cc/ops/yoso_ops.cc`), whose kernels
check their own inputs. The raw ops' gradients are registered here too, so graphs and
SavedModels that call them directly (and `tf.GradientTape` over them) differentiate; the public
functions of `keras_yoso.ops` bring their own gradients (`keras.ops.custom_gradient`).
"""

import tensorflow as tf
from tensorflow.python.framework import config as tf_config

from keras_yoso import _runtime
from keras_yoso.ops import _library


def load_error():
    return _library.load_error()


def _gpu_needs_determinism():
    """Under `enable_op_determinism()` with a GPU visible the GPU table cumulations (float atomics)
    raise UnimplementedError: "auto" then takes the deterministic composite."""
    return tf_config.is_op_determinism_enabled() and bool(tf.config.list_physical_devices("GPU"))


def usable_here():
    """False inside XLA-compiled graphs (no XLA kernels) and where determinism needs the composite."""
    return not _runtime.in_xla_context() and not _gpu_needs_determinism()


def _mask(mask):
    return tf.cast(mask, tf.float32)


def _lib():
    return _library.library()


def hash_codes(x, params, num_hashes, hash_code_len, method):
    run = _lib().yoso_gaussian_hash_codes if method == "gaussian" else _lib().yoso_hadamard_hash_codes
    return run(x, params, num_hashes=num_hashes, hash_code_len=hash_code_len)


def lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask, key_mask):
    return _lib().yoso_lsh_cumulation(_mask(query_mask), query_codes, _mask(key_mask), key_codes, value,
                                      num_buckets=num_buckets)


def weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets, query_mask,
                            key_mask):
    return _lib().yoso_weighted_lsh_cumulation(_mask(query_mask), query_codes, query_weight, _mask(key_mask),
                                               key_codes, key_weight, value, num_buckets=num_buckets)


def lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient, num_buckets, scale,
                          query_mask, key_mask):
    """(dQ, dK) of the eq. 4 lower bound: two weighted cumulations (see composite.lower_bound_gradients)."""
    dq = weighted_lsh_cumulation(query_codes, output_gradient, key_codes, value, key, num_buckets, query_mask, key_mask)
    dk = weighted_lsh_cumulation(key_codes, value, query_codes, output_gradient, query, num_buckets, key_mask,
                                 query_mask)
    return scale * dq, scale * dk


def collision_cumulation(query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len, epsilon,
                         query_mask, key_mask):
    return _lib().yoso_collision_cumulation(_mask(query_mask), query_codes, query, query_weight, _mask(key_mask),
                                            key_codes, key, key_weight, hash_code_len=hash_code_len,
                                            epsilon=epsilon)


def _register_gradients():
    @tf.RegisterGradient("YosoLshCumulation")
    def _lsh_cumulation_grad(op, dy):
        qm, qc, km, kc, value = op.inputs
        dv = _lib().yoso_lsh_cumulation(km, kc, qm, qc, tf.cast(dy, value.dtype),
                                        num_buckets=op.get_attr("num_buckets"))
        return [None, None, None, None, dv]

    @tf.RegisterGradient("YosoWeightedLshCumulation")
    def _weighted_lsh_cumulation_grad(op, dy):
        qm, qc, qw, km, kc, kw, value = op.inputs
        nb = op.get_attr("num_buckets")
        run = _lib().yoso_weighted_lsh_cumulation
        dy = tf.cast(dy, value.dtype)
        d_qw = run(qm, qc, dy, km, kc, value, kw, num_buckets=nb)
        d_kw = run(km, kc, value, qm, qc, dy, qw, num_buckets=nb)
        d_value = run(km, kc, kw, qm, qc, qw, dy, num_buckets=nb)
        return [None, None, d_qw, None, None, d_kw, d_value]

    for name in ("YosoGaussianHashCodes", "YosoHadamardHashCodes", "YosoCollisionCumulation"):
        tf.no_gradient(name)


if _library.library() is not None:
    _register_gradients()
