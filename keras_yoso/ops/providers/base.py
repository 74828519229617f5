"""The provider protocol: what an implementation of the YOSO primitives declares and provides.

A provider runs the primitives of the table `keras_yoso.ops._spec` on one backend's tensors:
`run(name, *inputs, *attributes)`, in the table's order (the C ABI's: masks float32 or bool
`[B, N]` first on each side, codes int32 `[B, m, N]`, then the float tensors), plus
`lower_bound_gradients`, the eq. 4 backward (the primitive of that name, scaled). `keras_yoso.ops`
wraps them with the checks, the gradients (`keras.ops.custom_gradient`) and the dtype casts, and
asks the provider's declarations, never its identity, what to do around a call: whether to check
the codes first, whether num_hashes must be known while tracing, whether a weighted cumulation's
per-bucket table must be split, whether the provider can run inside a compiled function. The
providers:

- `providers/composite.py`: `keras.ops`, every backend;
- `providers/tensorflow.py`: the TensorFlow op library (C++ and CUDA kernels);
- `providers/jax.py`: the native library's XLA FFI handlers (CPU);
- `providers/torch.py`: the native library's C ABI as `torch.library` ops (CPU).

`_dispatch.provider(implementation, tensors, causal)` is the one place that picks a provider for
a call.

The `causal` attribute of the cumulations (a Python int) restricts which keys count for a query,
positions aligned (Nq == Nk, checked by ops/yoso.py): 0 every key, 1 keys j <= i (causal
attention), -1 keys j >= i (the transposed cumulations of a causal backward: dK_j and dV_j sum
over queries i >= j).
"""

import functools

from keras_yoso import _validation


class Provider:
    """Base class of the providers. Subclasses set the declarations and implement `run`
    (`lower_bound_gradients` has a default: the primitive lower_bound_gradients, eq. 4)."""

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
    # XLA partitions its calls over a device mesh itself (keras.ops computations); else
    # `_dispatch.on_mesh` runs each device's block inside `jax.shard_map` (a custom call has no
    # partitioning rule: XLA would gather its operands).
    partitioned_by_xla = False

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

    def run(self, name, *arguments):
        """Primitive `name` of `_spec.PRIMITIVES` on `arguments`: its inputs, then its attributes, in
        the table's order. Returns the output tensor (float32 or the input dtype)."""
        raise NotImplementedError

    # The gradients of the cumulations, each a cumulation with the roles of queries and keys exchanged
    # (the transposed sum, in the opposite direction when causal). Written once here: ops/yoso.py's
    # custom gradients and the TensorFlow raw ops' registered gradients call them.

    def lsh_cumulation_gradient(self, query_mask, query_codes, key_mask, key_codes, output_gradient, num_buckets,
                                causal=0):
        """d value `[B, Nk, D]` of lsh_cumulation: each key sums the upstream rows of the queries it meets."""
        return self.run("lsh_cumulation", key_mask, key_codes, query_mask, query_codes, output_gradient, num_buckets,
                        -causal)

    def weighted_lsh_cumulation_gradients(self, query_mask, query_codes, query_weight, key_mask, key_codes,
                                          key_weight, value, output_gradient, num_buckets, causal=0):
        """(d query_weight, d key_weight, d value) of weighted_lsh_cumulation: with s_ij = [qc_i == kc_j],
        d qw_i = sum_j s_ij <dy_i, v_j> kw_j, d kw_j = sum_i s_ij <v_j, dy_i> qw_i and
        d v_j = sum_i s_ij <kw_j, qw_i> dy_i, three weighted cumulations."""
        run = functools.partial(self.run, "weighted_lsh_cumulation")
        return (run(query_mask, query_codes, output_gradient, key_mask, key_codes, value, key_weight, num_buckets,
                    causal),
                run(key_mask, key_codes, value, query_mask, query_codes, output_gradient, query_weight, num_buckets,
                    -causal),
                run(key_mask, key_codes, key_weight, query_mask, query_codes, query_weight, output_gradient,
                    num_buckets, -causal))

    def lower_bound_gradients(self, query_mask, query_codes, query, key_mask, key_codes, key, value,
                              output_gradient, num_buckets, scale, causal=0):
        """(dQ, dK) of the eq. 4 lower bound, each pair's weight <dY_i, V_j> computed once (the
        primitive lower_bound_gradients), times `scale`; causal: dQ_i over keys j <= i, dK_j over
        queries i >= j."""
        dq, dk = self.run("lower_bound_gradients", query_mask, query_codes, query, key_mask, key_codes, key, value,
                          output_gradient, num_buckets, causal)
        return scale * dq, scale * dk


def lower_bound_by_weighted_cumulations(provider, query_mask, query_codes, query, key_mask, key_codes, key, value,
                                        output_gradient, num_buckets, scale, causal=0):
    """Provider.lower_bound_gradients as two weighted cumulations (dQ = W(dY, V; K), dK = W(V, dY; Q)),
    for a provider that runs weighted_lsh_cumulation but not lower_bound_gradients somewhere (the
    TensorFlow op library on a GPU)."""
    dq = provider.run("weighted_lsh_cumulation", query_mask, query_codes, output_gradient, key_mask, key_codes, value,
                      key, num_buckets, causal)
    dk = provider.run("weighted_lsh_cumulation", key_mask, key_codes, value, query_mask, query_codes, output_gradient,
                      query, num_buckets, -causal)
    return scale * dq, scale * dk


def _inner(declaration):
    return property(lambda self: getattr(self.inner, declaration), doc=f"The wrapped provider's {declaration}.")


class DelegatingProvider(Provider):
    """A provider that wraps another, `inner`: it reports the declarations and device checks of
    `inner` and, unless a subclass says otherwise, runs every primitive there."""

    name = _inner("name")
    checks_codes = _inner("checks_codes")
    needs_static_num_hashes = _inner("needs_static_num_hashes")
    max_bucket_table_floats = _inner("max_bucket_table_floats")
    supports_jit = _inner("supports_jit")
    partitioned_by_xla = _inner("partitioned_by_xla")

    def __init__(self, inner):
        self.inner = inner

    def load_error(self):
        return self.inner.load_error()

    def usable_here(self):
        return self.inner.usable_here()

    def device_error(self, tensors, causal=0):
        return self.inner.device_error(tensors, causal)

    def run(self, name, *arguments):
        return self.inner.run(name, *arguments)

    def lower_bound_gradients(self, *arguments):
        return self.inner.lower_bound_gradients(*arguments)


class NativeLibraryProvider(Provider):
    """What the native library's C ABI (custom_ops/cc/c_api) does, whichever framework calls it:
    it checks codes itself, takes any num_hashes at run time, builds per-bucket tables of at most
    kMaxBucketTableFloats floats, runs inside compiled functions (XLA FFI, torch.compile) and sums
    every output element in a fixed order. The JAX and PyTorch providers subclass it."""

    checks_codes = True
    needs_static_num_hashes = False
    max_bucket_table_floats = _validation.MAX_BUCKET_TABLE_FLOATS
    supports_jit = True
