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
- `providers/jax.py`: the native library's XLA FFI handlers (CPU and CUDA);
- `providers/torch.py`: the native library's C ABI as `torch.library` ops (CPU and CUDA).

Devices: a provider says where a call on given tensors would run (`device_of`: "cpu", "gpu", or
another name), on which devices its kernels are loaded (`devices`), and so, with the devices column
of `_spec`, whether it runs a primitive there (`runs`). `_dispatch.provider(implementation,
tensors, causal, primitives)` is the one place that picks a provider for a call: the native one
when it runs every primitive of the call on the call's device, else the composite ("auto") or an
error naming the primitive and the device ("custom_op").

The `causal` attribute of the cumulations is a direction (`_spec.DIRECTIONS`, a Python int): which
keys count for a query, positions aligned (Nq == Nk, checked by ops/yoso.py): BIDIRECTIONAL every
key, CAUSAL keys j <= i (causal attention), ANTICAUSAL keys j >= i (the transposed cumulations of a
causal backward, `_spec.transposed_direction`: dK_j and dV_j sum over queries i >= j).
"""

import functools

from keras_yoso import _validation
from keras_yoso.ops import _spec
from keras_yoso.ops.providers import native_library


class Provider:
    """Base class of the providers. Subclasses set the declarations (`name` among them: no default)
    and implement `run` and, for the native ones, `device_of` and `devices`."""

    # What `keras_yoso.ops.implementation_in_use` reports for it: "custom_op" or "composite".
    name = None
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

    def device_of(self, tensors):
        """The device a call on `tensors` would run on: "cpu", "gpu", or the backend's name of another
        (e.g. "tpu", "mps"); the backend's default device when `tensors` say nothing."""
        return "cpu"

    def devices(self):
        """The devices of `_spec.DEVICES` its kernels are loaded for in this process."""
        return ("cpu",)

    def runs(self, name, device, causal=_spec.BIDIRECTIONAL):
        """True when primitive `name` runs here on `device` for a call in the direction `causal`: the
        provider's kernels are loaded for the device, the primitive has a kernel there (`_spec`) and
        this build holds it (`builds_gpu_kernel`)."""
        return (device in self.devices() and _spec.PRIMITIVES[name].runs_on(device, causal)
                and (device != "gpu" or self.builds_gpu_kernel(name, causal)))

    def builds_gpu_kernel(self, name, causal=_spec.BIDIRECTIONAL):
        """False where this build lacks the GPU kernel `_spec` declares for primitive `name` in the direction
        `causal`: the Triton kernels are optional (a native library built without their cubins runs
        lower_bound_gradients on the CPU only, where ops/yoso.py takes eq. 4 as two weighted cumulations on a
        GPU, and every causal call on the composite there)."""
        return True

    def device_error(self, tensors, causal=_spec.BIDIRECTIONAL, primitives=()):
        """None when the provider runs each of `primitives` on the device of `tensors` in the direction
        `causal`, else a message naming the device and, where the device is
        served, the first primitive without a kernel there. "auto" then takes the composite;
        "custom_op" raises ValueError with this message."""
        device = self.device_of(tensors)
        if device not in self.devices():
            return (f"the keras_yoso native kernels of this process run on {' and '.join(self.devices())}; this call "
                    f"runs on {device} (use implementation='composite' or 'auto' there)")
        for name in primitives:
            if not self.runs(name, device, causal):
                directed = causal != _spec.BIDIRECTIONAL and _spec.PRIMITIVES[name].runs_on(device)
                why = " with causal != 0" if directed else ""
                return (f"{name} has no {device} kernel{why} in the keras_yoso native kernels "
                        "(use implementation='composite' or 'auto' there)")
        return None

    def run(self, name, *arguments):
        """Primitive `name` of `_spec.PRIMITIVES` on `arguments`: its inputs, then its attributes, in
        the table's order. Returns the output tensor (float32 or the input dtype)."""
        raise NotImplementedError

    # The gradients of the cumulations, each a cumulation with the roles of queries and keys exchanged
    # (the transposed sum, in `_spec.transposed_direction` of the forward's). Written once here:
    # ops/yoso.py's custom gradients and the TensorFlow raw ops' registered gradients call them.

    def lsh_cumulation_gradient(self, query_mask, query_codes, key_mask, key_codes, output_gradient, num_buckets,
                                causal=_spec.BIDIRECTIONAL):
        """d value `[B, Nk, D]` of lsh_cumulation: each key sums the upstream rows of the queries it meets."""
        return self.run("lsh_cumulation", key_mask, key_codes, query_mask, query_codes, output_gradient, num_buckets,
                        _spec.transposed_direction(causal))

    def weighted_lsh_cumulation_gradients(self, query_mask, query_codes, query_weight, key_mask, key_codes,
                                          key_weight, value, output_gradient, num_buckets,
                                          causal=_spec.BIDIRECTIONAL):
        """(d query_weight, d key_weight, d value) of weighted_lsh_cumulation: with s_ij = [qc_i == kc_j],
        d qw_i = sum_j s_ij <dy_i, v_j> kw_j, d kw_j = sum_i s_ij <v_j, dy_i> qw_i and
        d v_j = sum_i s_ij <kw_j, qw_i> dy_i, three weighted cumulations."""
        run = functools.partial(self.run, "weighted_lsh_cumulation")
        transposed = _spec.transposed_direction(causal)
        return (run(query_mask, query_codes, output_gradient, key_mask, key_codes, value, key_weight, num_buckets,
                    causal),
                run(key_mask, key_codes, value, query_mask, query_codes, output_gradient, query_weight, num_buckets,
                    transposed),
                run(key_mask, key_codes, key_weight, query_mask, query_codes, query_weight, output_gradient,
                    num_buckets, transposed))

    def lower_bound_gradients(self, query_mask, query_codes, query, key_mask, key_codes, key, value,
                              output_gradient, num_buckets, scale, causal=_spec.BIDIRECTIONAL, fused=True):
        """(dQ, dK) of the eq. 4 lower bound times `scale`; causal: dQ_i over keys j <= i, dK_j over
        queries i >= j. fused=True: each pair's weight <dY_i, V_j> computed once for both (the
        primitive lower_bound_gradients); False: two weighted cumulations, dQ = W(dY, V; K) and
        dK = W(V, dY; Q), for a device where only weighted_lsh_cumulation has a kernel (the caller,
        ops/yoso.py, chooses from `runs`)."""
        if fused:
            dq, dk = self.run("lower_bound_gradients", query_mask, query_codes, query, key_mask, key_codes, key, value,
                              output_gradient, num_buckets, causal)
            return scale * dq, scale * dk
        dq = self.run("weighted_lsh_cumulation", query_mask, query_codes, output_gradient, key_mask, key_codes, value,
                      key, num_buckets, causal)
        dk = self.run("weighted_lsh_cumulation", key_mask, key_codes, value, query_mask, query_codes, output_gradient,
                      query, num_buckets, _spec.transposed_direction(causal))
        return scale * dq, scale * dk

    def linear_relative_total(self, phi_q, phi_k, v, scores, horizon, causal, chunk_size):
        """The rows [B, Lq, dv + 1] of Scaleformer's eq. 10 (numerator | denominator): the kernel term
        plus the relative term. LinearRelativeAttention has no native kernel: the composite provider
        computes them, and the sequence-sharded provider adds the other blocks' terms."""
        raise NotImplementedError(f"{type(self).__name__} has no linear_relative_total (no native kernel)")


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

    def device_of(self, tensors):
        return self.inner.device_of(tensors)

    def devices(self):
        return self.inner.devices()

    def runs(self, name, device, causal=_spec.BIDIRECTIONAL):
        return self.inner.runs(name, device, causal)

    def device_error(self, tensors, causal=_spec.BIDIRECTIONAL, primitives=()):
        return self.inner.device_error(tensors, causal, primitives)

    def run(self, name, *arguments):
        return self.inner.run(name, *arguments)

    def lower_bound_gradients(self, *arguments, fused=True):
        return self.inner.lower_bound_gradients(*arguments, fused=fused)


class NativeLibraryProvider(Provider):
    """What the native library's C ABI (custom_ops/cc/c_api) does, whichever framework calls it:
    it checks codes itself, takes any num_hashes at run time, builds per-bucket tables of at most
    kMaxBucketTableFloats floats, runs inside compiled functions (XLA FFI, torch.compile) and, on
    the CPU, sums every output element in a fixed order (the CUDA table cumulations use float
    atomics). The JAX and PyTorch providers subclass it."""

    name = "custom_op"
    checks_codes = True
    needs_static_num_hashes = False
    max_bucket_table_floats = _validation.MAX_BUCKET_TABLE_FLOATS
    supports_jit = True

    def builds_gpu_kernel(self, name, causal=_spec.BIDIRECTIONAL):
        return name in native_library.gpu_kernel_names(causal)
