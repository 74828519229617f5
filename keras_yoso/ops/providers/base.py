"""The provider protocol: what an implementation of the YOSO primitives declares and provides.

A provider runs the five primitives below on one backend's tensors. `keras_yoso.ops` wraps them
with the checks, the gradients (`keras.ops.custom_gradient`) and the dtype casts, and asks the
provider's declarations, never its identity, what to do around a call: whether to check the codes
first, whether num_hashes must be known while tracing, whether a weighted cumulation's per-bucket
table must be split, whether the provider can run inside a compiled function. The providers:

- `providers/composite.py`: `keras.ops`, every backend;
- `providers/tensorflow.py`: the TensorFlow op library (C++ and CUDA kernels);
- `providers/jax.py`: the native library's XLA FFI handlers (CPU);
- `providers/torch.py`: the native library's C ABI as `torch.library` ops (CPU).

`_dispatch.provider(implementation, tensors)` is the one place that picks a provider for a call.

Primitive signatures (all tensors of the running backend; masks bool or float `[B, N]`; codes
int32 `[B, m, N]`):

    hash_codes(x, params, num_hashes, hash_code_len, method) -> int32 [B, m, N]
    lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0)
        -> [B, Nq, D]
    weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                            query_mask, key_mask, causal=0) -> [B, Nq, D]
    lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                          scale, query_mask, key_mask, causal=0) -> (dQ [B, Nq, d], dK [B, Nk, d])

`causal` (a Python int) restricts which keys count for a query, positions aligned (Nq == Nk,
checked by ops/yoso.py): 0 every key, 1 keys j <= i (causal attention), -1 keys j >= i (the
transposed cumulations of a causal backward: dK_j and dV_j sum over queries i >= j).
    collision_cumulation(query_codes, query, query_weight, key_codes, key, key_weight,
                         hash_code_len, epsilon, query_mask, key_mask) -> [B, Nq, d]
"""

from keras_yoso import _validation


class Provider:
    """Base class of the providers. Subclasses set the declarations and implement the primitives
    (`lower_bound_gradients` has a default: two weighted cumulations, eq. 4)."""

    # What `keras_yoso.ops.implementation_in_use` reports for it: "custom_op" or "composite".
    name = "custom_op"
    # The kernels reject codes outside [0, num_buckets) themselves (else ops/yoso.py checks them).
    checks_codes = True
    # num_hashes (axis 1 of the codes) must be known while a graph is traced.
    needs_static_num_hashes = False
    # Largest per-bucket [W, D] table of weighted_lsh_cumulation, in floats (None: no limit).
    # ops/yoso.py splits wider lower-bound gradients into column blocks that fit.
    max_bucket_table_floats = None
    # Runs inside compiled functions: XLA (TF jit_compile, jax.jit) or torch.compile.
    supports_jit = False

    def load_error(self):
        """None when the provider can run in this process, else why not (one sentence)."""
        return None

    def usable_here(self):
        """False where "auto" should take the composite in the current context (e.g. inside a
        TensorFlow XLA graph, or under op determinism on a GPU)."""
        return True

    def device_error(self, tensors, causal=0):
        """None when the provider can take `tensors` where they live (for a `causal` call when causal
        is nonzero), else a message naming the device (e.g. CPU kernels handed CUDA tensors). "auto"
        then takes the composite; "custom_op" raises ValueError with this message."""
        return None

    def lower_bound_gradients(self, query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                              scale, query_mask, key_mask, causal=0):
        """(dQ, dK) of the eq. 4 lower bound: two weighted cumulations (see composite/cumulation.py);
        causal: dQ_i over keys j <= i, dK_j over queries i >= j."""
        dq = self.weighted_lsh_cumulation(query_codes, output_gradient, key_codes, value, key, num_buckets,
                                          query_mask, key_mask, causal=causal)
        dk = self.weighted_lsh_cumulation(key_codes, value, query_codes, output_gradient, query, num_buckets,
                                          key_mask, query_mask, causal=-causal)
        return scale * dq, scale * dk

    def hash_codes(self, x, params, num_hashes, hash_code_len, method):
        raise NotImplementedError

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        raise NotImplementedError

    def weighted_lsh_cumulation(self, query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                                query_mask, key_mask, causal=0):
        raise NotImplementedError

    def collision_cumulation(self, query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len,
                             epsilon, query_mask, key_mask):
        raise NotImplementedError


class NativeLibraryProvider(Provider):
    """What the native library's C ABI (custom_ops/cc/c_api) does, whichever framework calls it:
    it checks codes itself, takes any num_hashes at run time, builds per-bucket tables of at most
    kMaxBucketTableFloats floats, runs inside compiled functions (XLA FFI, torch.compile) and sums
    every output element in a fixed order. The JAX and PyTorch providers subclass it."""

    checks_codes = True
    needs_static_num_hashes = False
    max_bucket_table_floats = _validation.MAX_BUCKET_TABLE_FLOATS
    supports_jit = True
