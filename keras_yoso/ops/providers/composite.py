"""The composite as a provider: the `keras.ops` algorithms of `keras_yoso.ops.composite`, every backend."""

from keras_yoso.ops.composite.causal import causal_cumulation
from keras_yoso.ops.composite.collision import collision_cumulation
from keras_yoso.ops.composite.cumulation import lower_bound_gradients
from keras_yoso.ops.composite.cumulation import lsh_cumulation
from keras_yoso.ops.composite.cumulation import weighted_lsh_cumulation
from keras_yoso.ops.composite.hashing import hash_codes
from keras_yoso.ops.providers import base


class _CompositeProvider(base.Provider):
    """The composite as a provider: every backend, inside any compiled function; it cannot check
    codes in traced code (ops/yoso.py checks them where it can), and it chunks by num_hashes, which
    must therefore be known while tracing."""

    name = "composite"
    checks_codes = False
    needs_static_num_hashes = True
    supports_jit = True

    hash_codes = staticmethod(hash_codes)
    collision_cumulation = staticmethod(collision_cumulation)

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        if causal:
            return causal_cumulation(query_codes, None, key_codes, None, value, num_buckets, query_mask, key_mask,
                                     causal)
        return lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask, key_mask)

    def weighted_lsh_cumulation(self, query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                query_mask, key_mask, causal=0):
        if causal:
            return causal_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                     query_mask, key_mask, causal)
        return weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                       query_mask, key_mask)

    def lower_bound_gradients(self, query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                              scale, query_mask, key_mask, causal=0):
        if causal:
            return super().lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient,
                                                 num_buckets, scale, query_mask, key_mask, causal)
        return lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                                     scale, query_mask, key_mask)


PROVIDER = _CompositeProvider()
