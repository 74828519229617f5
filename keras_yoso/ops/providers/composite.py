"""The composite as a provider: the `keras.ops` algorithms of `keras_yoso.ops.composite`, every backend."""

import functools

from keras import ops

from keras_yoso.ops.composite.causal import causal_cumulation
from keras_yoso.ops.composite.collision import collision_cumulation
from keras_yoso.ops.composite.cumulation import lower_bound_gradients
from keras_yoso.ops.composite.cumulation import lsh_cumulation
from keras_yoso.ops.composite.cumulation import weighted_lsh_cumulation
from keras_yoso.ops.composite.decoding import lsh_cumulation_step
from keras_yoso.ops.composite.hashing import hash_codes
from keras_yoso.ops.composite.linear_relative import chunk_rows
from keras_yoso.ops.composite.linear_relative import total_rows
from keras_yoso.ops.providers import base


def _lsh(query_mask, query_codes, key_mask, key_codes, value, num_buckets, causal):
    if causal:
        return causal_cumulation(query_mask, query_codes, None, key_mask, key_codes, None, value, num_buckets, causal)
    return lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets)


def _weighted(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value, num_buckets, causal):
    if causal:
        return causal_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                                 num_buckets, causal)
    return weighted_lsh_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight, value,
                                   num_buckets)


# `_spec.PRIMITIVES` name -> the composite function that computes it (same arguments, same order).
_FUNCTIONS = {
    "gaussian_hash_codes": functools.partial(hash_codes, method="gaussian"),
    "hadamard_hash_codes": functools.partial(hash_codes, method="hadamard"),
    "hadamard_interleaved_hash_codes": functools.partial(hash_codes, method="hadamard_interleaved"),
    "lsh_cumulation": _lsh,
    "lsh_cumulation_step": lsh_cumulation_step,
    "weighted_lsh_cumulation": _weighted,
    "collision_cumulation": collision_cumulation,
}


class _CompositeProvider(base.Provider):
    """The composite as a provider: every backend, inside any compiled function; it cannot check
    codes in traced code (ops/yoso.py checks them where it can), and it chunks by num_hashes, which
    must therefore be known while tracing. Masks are bool; outputs float32."""

    name = "composite"
    checks_codes = False
    needs_static_num_hashes = True
    supports_jit = True
    partitioned_by_xla = True

    def run(self, name, *arguments):
        return _FUNCTIONS[name](*arguments)

    def lower_bound_gradients(self, query_mask, query_codes, query, key_mask, key_codes, key, value,
                              output_gradient, num_buckets, scale, causal=0):
        if causal:
            return super().lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value,
                                                 output_gradient, num_buckets, scale, causal)
        return lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value,
                                     output_gradient, num_buckets, scale)

    def linear_relative_total(self, phi_q, phi_k, v, scores, horizon, causal, chunk_size):
        """The rows [B, Lq, dv + 1] of Scaleformer's eq. 10 (numerator | denominator): kernel term plus
        relative term (composite/linear_relative.py); LinearRelativeAttention has no native kernel."""
        return total_rows(phi_q, phi_k, v, scores, horizon, causal, chunk_rows(chunk_size, ops.shape(phi_q)[1]))


PROVIDER = _CompositeProvider()
