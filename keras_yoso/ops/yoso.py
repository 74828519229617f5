"""YOSO ops: cumulation (hash scatter/gather), YOSO attention with the paper's backward estimators,
and YOSO-E.

Every function takes `implementation="auto" | "custom_op" | "composite"` (see
`keras_yoso.ops._dispatch.provider`): "custom_op" runs the backend's native kernels (TensorFlow's
C++/CUDA op library; the native library's CPU kernels on JAX and PyTorch), "composite" the
`keras.ops` composite (every backend; same numbers to float32 rounding; XLA- and
serving-friendly), "auto" the native kernels where they are loaded and usable, else the
composite. Gradients are the same `keras.ops.custom_gradient`s for both; what differs between
providers is read from their declarations (`providers/base.py`).

`B` is any flattened batch (batch x heads). Codes are int `[B, m, N]`. Masks are `[B, N]`, bool or
numeric (any nonzero keeps the position). float16, bfloat16 and float32 inputs are accumulated in
float32; outputs keep the input dtype. Paper: Zeng et al., "You Only Sample (Almost) Once",
ICML 2021.

Device meshes (JAX): under a `keras.distribution` every call is placed by `_dispatch.on_mesh`:
native kernels run per device block inside `jax.shard_map` (never gathered); under
`keras_yoso.distribution.SequenceParallel` `hash_codes`, `lsh_cumulation` and `yoso_cumulation`
(lower-bound backward) split the sequence too, adding the other devices' keys through their
bucket tables (`parallel/yoso_tables.py`); the weighted and collision cumulations keep it whole.
"""

import functools

from keras import ops

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec
from keras_yoso.ops.composite import collision
from keras_yoso.ops.composite.masking import keep_rows


def _ones_mask(codes):
    return ops.ones((ops.shape(codes)[0], ops.shape(codes)[2]), "bool")


def _prepare_sides(query_codes, key_codes, query_mask, key_mask, query_side, key_side, num_buckets, provider,
                   widths=(), causal=_spec.BIDIRECTIONAL):
    """Converts and checks the codes and masks of both sides and the per-position tensors.

    query_side / key_side: [(name, tensor [B, N, *])] of each side; widths: extra
    [(entries, what)] groups of `_validation.agree`. Shapes known now are checked now
    (ValueError); unknown ones (TensorFlow graphs) when the graph runs (InvalidArgumentError,
    same messages). The composite also checks that the codes are in [0, num_buckets) (the
    custom ops check them in their kernels).

    Returns (query_codes, key_codes, query_mask, key_mask, query tensors, key tensors).
    """
    qc = _validation.codes_tensor(query_codes, "query_codes", num_buckets)
    kc = _validation.codes_tensor(key_codes, "key_codes", num_buckets)
    checks = _validation.agree([("query_codes", qc, 1), ("key_codes", kc, 1)], "num_hashes (axis 1 of the codes)")
    if causal:
        checks += _validation.agree([("query_codes axis 2", qc, 2), ("key_codes axis 2", kc, 2)],
                                    "query and key lengths (causal=True aligns query i with key i)")
    num_hashes = _backend.static_shape(qc)[1]
    if num_hashes == 0:
        raise ValueError(f"query_codes must have num_hashes >= 1 (axis 1), got shape {_backend.static_shape(qc)}")
    if num_hashes is None:
        if provider.needs_static_num_hashes:
            raise ValueError("num_hashes (axis 1 of query_codes) must be known when the graph is built for the "
                             f"composite path; got shape {_backend.static_shape(qc)}")
        checks += _backend.check(ops.greater(ops.shape(qc)[1], 0), "query_codes must have num_hashes >= 1 (axis 1)")
    named = {"query_codes": qc, "key_codes": kc}
    for side, codes, mask, per_position in (("query", qc, query_mask, query_side), ("key", kc, key_mask, key_side)):
        given = [] if mask is None else [(f"{side}_mask", _validation.mask_tensor(mask, f"{side}_mask"))]
        named.update(given)
        checks += _validation.agree([(f"{side}_codes", codes, 0)] + [(name, t, 0) for name, t in given + per_position],
                                    f"batch sizes (axis 0) of the {side} inputs")
        checks += _validation.agree([(f"{side}_codes axis 2", codes, 2)]
                                    + [(f"{name} axis 1", t, 1) for name, t in given + per_position],
                                    f"{side} lengths")
    checks += _validation.agree([("query_codes", qc, 0), ("key_codes", kc, 0)],
                                "batch sizes (axis 0) of queries and keys")
    for entries, what in widths:
        checks += _validation.agree(entries, what)
    if not provider.checks_codes:
        checks += _validation.codes_in_range(qc, num_buckets, "query_codes")
        checks += _validation.codes_in_range(kc, num_buckets, "key_codes")
    named.update(query_side)
    named.update(key_side)
    named = dict(zip(named, _backend.after(checks, list(named.values()))))
    qc, kc = named["query_codes"], named["key_codes"]
    qm = named["query_mask"] if "query_mask" in named else _ones_mask(qc)
    km = named["key_mask"] if "key_mask" in named else _ones_mask(kc)
    return qc, kc, qm, km, [named[name] for name, _ in query_side], [named[name] for name, _ in key_side]


def _lsh(provider, qm, qc, km, kc, value, num_buckets, causal):
    """lsh_cumulation in the direction `causal`, differentiable in `value` (its gradient is the transposed
    cumulation, `lsh_cumulation_gradient`)."""

    @ops.custom_gradient
    def cumulation(v):
        def grad(*args, upstream=None):
            dy = ops.cast(_backend.upstream_gradient(args, upstream), v.dtype)
            return ops.cast(provider.lsh_cumulation_gradient(qm, qc, km, kc, dy, num_buckets, causal), v.dtype)

        return ops.cast(provider.run("lsh_cumulation", qm, qc, km, kc, v, num_buckets, causal), v.dtype), grad

    return cumulation(value)


def _roles(*names):
    """The axis roles (`_dispatch.on_mesh`) of the tensors named as the primitives name them."""
    return [_spec.roles(name) for name in names]


def _direction(causal):
    """The providers' direction (`_spec.DIRECTIONS`) of the public `causal` flag: CAUSAL or BIDIRECTIONAL."""
    return _spec.CAUSAL if _validation.boolean(causal, "causal") else _spec.BIDIRECTIONAL


def lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask=None, key_mask=None,
                   implementation="auto", causal=False):
    """LSH cumulation: YOSO's Bernoulli-sampled attention, eq. 2 averaged over m hashes (§3.2).

    out[b, i] = qmask[b, i] (1/m) sum_h sum_j kmask[b, j] [qc[b,h,i] == kc[b,h,j]] value[b, j]

    computed by scattering values into `num_buckets` buckets per hash and gathering by query
    code: O(B m (Nq + Nk) D) time, no O(N^2) term.

    causal=True sums over keys j <= i only (Nq == Nk, else ValueError): with fixed hash functions
    this is linear attention with one-hot features, a prefix sum inside each bucket in position
    order (per hash, a stable sort by (code, position), then segmented prefix sums): O(B m N D)
    time and memory, the same order as the bidirectional cumulation. The gradient in `value` is
    the transposed cumulation over queries i >= j.

    Args:
      query_codes: int `[B, m, Nq]`; key_codes: int `[B, m, Nk]`, in [0, num_buckets).
      value: float `[B, Nk, D]`.
      num_buckets: a power of two <= 2**20 (2**hash_code_len).
      query_mask: `[B, Nq]` or None; masked queries output 0.
      key_mask: `[B, Nk]` or None; masked keys never contribute (NaN in them included).
      implementation: "auto", "custom_op" or "composite".
      causal: if True, key j counts for query i only when j <= i.

    Returns:
      `[B, Nq, D]` in value's dtype. Differentiable in `value`.
    """
    num_buckets = _validation.num_buckets(num_buckets)
    causal = _direction(causal)
    value = _validation.float_tensor(value, "value", 3)
    provider = _dispatch.provider(implementation, (value,), causal, ("lsh_cumulation",))
    qc, kc, qm, km, _, (value,) = _prepare_sides(query_codes, key_codes, query_mask, key_mask, [],
                                                 [("value", value)], num_buckets, provider, causal=causal)
    return _dispatch.on_mesh(provider, lambda p, *t: _lsh(p, *t, num_buckets, causal), (qm, qc, km, kc, value),
                             _roles("query_mask", "query_codes", "key_mask", "key_codes", "value"), _spec.ROWS_ROLES)


def _check_pair_table(provider, weight, value):
    """The provider's per-bucket [W, D] table limit (`max_bucket_table_floats`), checked before the call."""
    if provider.max_bucket_table_floats is not None:
        _validation.check_bucket_table(_backend.static_shape(weight)[2], _backend.static_shape(value)[2],
                                       provider.max_bucket_table_floats)


def _weighted(provider, qm, qc, query_weight, km, kc, key_weight, value, num_buckets):
    """weighted_lsh_cumulation, differentiable in query_weight, key_weight and value (each gradient is
    itself a weighted cumulation with the roles of the inputs exchanged)."""
    run = functools.partial(provider.run, "weighted_lsh_cumulation")

    @ops.custom_gradient
    def cumulation(qw, kw, v):
        def grad(*args, upstream=None):
            dy = ops.cast(_backend.upstream_gradient(args, upstream), v.dtype)
            d_qw, d_kw, d_v = provider.weighted_lsh_cumulation_gradients(qm, qc, qw, km, kc, kw, v, dy, num_buckets)
            return ops.cast(d_qw, qw.dtype), ops.cast(d_kw, kw.dtype), ops.cast(d_v, v.dtype)

        return ops.cast(run(qm, qc, qw, km, kc, kw, v, num_buckets, 0), v.dtype), grad

    return cumulation(query_weight, key_weight, value)


def weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                            query_mask=None, key_mask=None, implementation="auto"):
    """LSH cumulation with each colliding pair weighted by <query_weight[b,i], key_weight[b,j]>.

    out[b, i] = qmask (1/m) sum_h sum_j kmask [qc == kc] <qw[b,i], kw[b,j]> value[b, j]

    The building block of the lower-bound backward (paper eq. 4). Cost: per hash, each bucket
    costs min(nq nk (W + D), (nq + nk) W D) in the custom op; the composite sorts by code and
    multiplies dense query tiles with key windows (bucket tables when the codes are skewed), see
    `keras_yoso.ops.composite`.

    Args:
      query_codes `[B, m, Nq]`, query_weight `[B, Nq, W]`, key_codes `[B, m, Nk]`,
      key_weight `[B, Nk, W]`, value `[B, Nk, D]`, num_buckets, masks and
      implementation as in `lsh_cumulation`.

    The custom op's per-bucket table, W * D floats, may hold at most 2**28 (1 GiB): a larger one
    raises ValueError (InvalidArgumentError when W or D is only known at run time).

    Returns:
      `[B, Nq, D]`. Differentiable in query_weight, key_weight and value.
    """
    num_buckets = _validation.num_buckets(num_buckets)
    query_weight = _validation.float_tensor(query_weight, "query_weight", 3)
    key_weight = _validation.float_tensor(key_weight, "key_weight", 3)
    value = _validation.float_tensor(value, "value", 3)
    provider = _dispatch.provider(implementation, (query_weight, key_weight, value), _spec.BIDIRECTIONAL,
                                  ("weighted_lsh_cumulation",))
    widths = [([("query_weight", query_weight, 2), ("key_weight", key_weight, 2)],
               "weight widths (axis 2 of query_weight and key_weight)")]
    qc, kc, qm, km, (query_weight,), (key_weight, value) = _prepare_sides(
        query_codes, key_codes, query_mask, key_mask, [("query_weight", query_weight)],
        [("key_weight", key_weight), ("value", value)], num_buckets, provider, widths)
    _check_pair_table(provider, query_weight, value)
    query_weight, key_weight = ops.cast(query_weight, value.dtype), ops.cast(key_weight, value.dtype)
    names = _spec.PRIMITIVES["weighted_lsh_cumulation"].input_names
    return _dispatch.on_mesh(provider, lambda p, *t: _weighted(p, *t, num_buckets),
                             (qm, qc, query_weight, km, kc, key_weight, value), _roles(*names), _spec.ROWS_ROLES,
                             split_sequence=False)


def _lower_bound_gradients(provider, qm, qc, q, km, kc, k, v, dy, num_buckets, scale, causal, fused):
    """(dQ, dK) of eq. 4 (fused: the primitive lower_bound_gradients, else two weighted cumulations).
    A provider's per-bucket table holds W * D floats (W: value width, D: key width) up to its
    `max_bucket_table_floats`: wider heads are split into column blocks that fit, so the backward
    never fails."""
    dim, value_dim = _backend.static_shape(q)[2], _backend.static_shape(v)[2]
    limit = provider.max_bucket_table_floats
    if limit is None or dim is None or value_dim is None or dim * value_dim <= limit:
        return provider.lower_bound_gradients(qm, qc, q, km, kc, k, v, dy, num_buckets, scale, causal, fused=fused)
    step = max(1, limit // max(1, value_dim))
    parts = [provider.lower_bound_gradients(qm, qc, q[:, :, c:c + step], km, kc, k[:, :, c:c + step], v, dy,
                                            num_buckets, scale, causal, fused=fused) for c in range(0, dim, step)]
    return ops.concatenate([p[0] for p in parts], axis=-1), ops.concatenate([p[1] for p in parts], axis=-1)


def yoso_cumulation(query, key, value, query_codes, key_codes, hash_code_len, query_mask=None,
                    key_mask=None, backward="lower_bound", implementation="auto", causal=False):
    """YOSO attention Y = B(Q, K) V with a gradient from the paper's estimators.

    Forward equals `lsh_cumulation(query_codes, key_codes, value, 2**hash_code_len, masks)`
    (eq. 2). The gradient reuses the forward's codes; c_ij = number of hashes in which query i
    and key j collide:

    - backward="lower_bound" (eq. 4): dV_j = (1/m) sum_i c_ij dY_i,
      dQ_i = (tau/2)(1/m) sum_j c_ij <dY_i, V_j> K_j, dK_j = (tau/2)(1/m) sum_i c_ij <dY_i, V_j> Q_i,
      one pass per hash that sorts the codes once and computes each colliding pair's weight
      <dY_i, V_j> once for both dQ and dK (the primitive lower_bound_gradients): linear in the
      lengths.
    - backward="collision" (*YOSO, appendix eq. 2 restricted to colliding pairs): over pairs
      colliding in >= 1 hash, each once, w_ij = <dY_i, V_j> tau (1 - acos(x)/pi)^(tau-1)
      / (pi sqrt(1 - x^2 + eps)), x = <Q_i, K_j> clipped to [-1, 1], eps = 1e-6;
      dQ_i = sum_j w_ij K_j, dK_j = sum_i w_ij Q_i, dV as above. Cost O(nnz (m + d + D)) with nnz
      the number of colliding pairs (both implementations sort by code).

    causal=True (self-attention, Nq == Nk, else ValueError): query i sums keys j <= i in the
    forward, and the eq. 4 backward keeps the same pairs: dQ_i over j <= i, dK_j and dV_j over
    i >= j (a causal and two anti-causal cumulations, each a segmented prefix sum in
    (code, position) order; see `lsh_cumulation`). backward="collision" is not implemented for
    causal attention (ValueError).

    Args:
      query `[B, Nq, d]`, key `[B, Nk, d]`: expected unit-norm (not renormalized here).
      value `[B, Nk, D]`; query_codes `[B, m, Nq]`, key_codes `[B, m, Nk]` from
      `hash_codes(query/key, m, hash_code_len, same seed)`.
      hash_code_len: tau in [1, 20]; masks and implementation as in `lsh_cumulation`.
      causal: if True, query i attends to keys j <= i only.

    Returns:
      `[B, Nq, D]` in value's dtype.
    """
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=True)
    backward = _validation.choice(backward, "backward", _validation.SAMPLED_BACKWARDS)
    causal = _direction(causal)
    if causal and backward != "lower_bound":
        raise ValueError(f"backward={backward!r} is not implemented for causal=True: use backward=\"lower_bound\" "
                         "(paper eq. 4), whose causal form sums the same pairs j <= i as the forward.")
    num_buckets = 2 ** hash_code_len
    value = _validation.float_tensor(value, "value", 3)
    query = ops.cast(_validation.float_tensor(query, "query", 3), value.dtype)
    key = ops.cast(_validation.float_tensor(key, "key", 3), value.dtype)
    # eq. 4 runs fused (lower_bound_gradients) where the native kernels have it on this device in this direction
    # (on a GPU, causal calls have no other kernel), else as two weighted cumulations; the collision estimator is
    # its own primitive.
    backward_primitive = "collision_cumulation"
    if backward == "lower_bound":
        native, _ = _dispatch.native_provider()
        fused_here = native is not None and native.runs("lower_bound_gradients", native.device_of((query, key, value)),
                                                        causal)
        backward_primitive = "lower_bound_gradients" if fused_here else "weighted_lsh_cumulation"
    provider = _dispatch.provider(implementation, (query, key, value), causal, ("lsh_cumulation", backward_primitive))
    fused = provider.runs("lower_bound_gradients", provider.device_of((query, key, value)), causal)
    widths = [([("query", query, 2), ("key", key, 2)], "query and key widths (axis 2)")]
    qc, kc, qm, km, (query,), (key, value) = _prepare_sides(
        query_codes, key_codes, query_mask, key_mask, [("query", query)], [("key", key), ("value", value)],
        num_buckets, provider, widths, causal=causal)
    half_tau = hash_code_len / 2.0
    epsilon = _validation.COLLISION_EPSILON

    def run(provider, qm, qc, km, kc, query, key, value):
        @ops.custom_gradient
        def attention(q, k, v):
            def grad(*args, upstream=None):
                dy = ops.cast(_backend.upstream_gradient(args, upstream), v.dtype)
                if backward == "lower_bound":
                    dq, dk = _lower_bound_gradients(provider, qm, qc, q, km, kc, k, v, dy, num_buckets, half_tau,
                                                    causal, fused)
                else:
                    dq = provider.run("collision_cumulation", qm, qc, q, dy, km, kc, k, v, hash_code_len, epsilon)
                    dk = provider.run("collision_cumulation", km, kc, k, v, qm, qc, q, dy, hash_code_len, epsilon)
                dv = provider.lsh_cumulation_gradient(qm, qc, km, kc, dy, num_buckets, causal)
                return ops.cast(dq, q.dtype), ops.cast(dk, k.dtype), ops.cast(dv, v.dtype)

            return ops.cast(provider.run("lsh_cumulation", qm, qc, km, kc, v, num_buckets, causal), v.dtype), grad

        return attention(query, key, value)

    # *YOSO (collision) weighs each colliding pair by <Q_i, K_j> itself: no bucket-sum form across
    # devices, so it keeps the sequence whole.
    return _dispatch.on_mesh(provider, run, (qm, qc, km, kc, query, key, value),
                             _roles("query_mask", "query_codes", "key_mask", "key_codes", "query", "key", "value"),
                             _spec.ROWS_ROLES, split_sequence=backward == "lower_bound")


def collision_cumulation(query_codes, query, query_weight, key_codes, key, key_weight, hash_code_len,
                         query_mask=None, key_mask=None, implementation="auto"):
    """The *YOSO estimator (appendix eq. 2 on colliding pairs): `[B, Nq, d]`,
    sum_j w_ij key_j over keys colliding with query i in >= 1 hash, each pair once, with
    w_ij = <query_weight_i, key_weight_j> tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + 1e-6)),
    x = <query_i, key_j> clipped to [-1, 1]. The dQ of `yoso_cumulation(backward="collision")` is
    this with query_weight = dY and key_weight = V. Not differentiable (a gradient, not a layer op).
    """
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=True)
    num_buckets = 2 ** hash_code_len
    query_weight = _validation.float_tensor(query_weight, "query_weight", 3)
    dtype = query_weight.dtype
    query = ops.cast(_validation.float_tensor(query, "query", 3), dtype)
    key = ops.cast(_validation.float_tensor(key, "key", 3), dtype)
    key_weight = ops.cast(_validation.float_tensor(key_weight, "key_weight", 3), dtype)
    provider = _dispatch.provider(implementation, (query, query_weight, key, key_weight), _spec.BIDIRECTIONAL,
                                  ("collision_cumulation",))
    widths = [([("query", query, 2), ("key", key, 2)], "query and key widths (axis 2)"),
              ([("query_weight", query_weight, 2), ("key_weight", key_weight, 2)],
               "weight widths (axis 2 of query_weight and key_weight)")]
    qc, kc, qm, km, (query, query_weight), (key, key_weight) = _prepare_sides(
        query_codes, key_codes, query_mask, key_mask, [("query", query), ("query_weight", query_weight)],
        [("key", key), ("key_weight", key_weight)], num_buckets, provider, widths)
    names = _spec.PRIMITIVES["collision_cumulation"].input_names
    out = _dispatch.on_mesh(
        provider, lambda p, *t: p.run("collision_cumulation", *t, hash_code_len, _validation.COLLISION_EPSILON),
        (qm, qc, query, query_weight, km, kc, key, key_weight), _roles(*names), _spec.ROWS_ROLES,
        split_sequence=False)
    return ops.cast(out, dtype)


def yoso_expectation(query, key, value, hash_code_len, query_mask=None, key_mask=None,
                     backward="lower_bound", implementation="auto"):
    """YOSO-E: the expectation of YOSO over hash functions, E V (§3.1), in O(N^2).

    E_ij = (1 - acos(<Q_i, K_j>)/pi)^tau, the cosine clipped to [-1, 1] (no NaN at +-1); masked
    keys are dropped and masked queries output 0.

    backward="lower_bound": dQ = (tau/2)[(dY V^T) . E] K, dK = (tau/2)[(dY V^T) . E]^T Q
    (appendix eq. 3); backward="exact": the true derivative (appendix eq. 2),
    tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)), eps = 1e-6 keeps it finite at
    x = +-1. dV = E^T dY for both. Dense matmuls in every `implementation` (there is no faster
    kernel for an O(N^2) quantity).

    Returns `[B, Nq, D]` in value's dtype.
    """
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=False)
    backward = _validation.choice(backward, "backward", _validation.EXPECTATION_BACKWARDS)
    _dispatch.provider(implementation)
    query, key, value, qm, km = _validation.dense_attention_inputs(query, key, value, query_mask, key_mask)
    dtype = value.dtype
    pair_mask = ops.cast(ops.logical_and(qm[:, :, None], km[:, None, :]), "float32")
    tau = float(hash_code_len)
    compute = "float32"

    @ops.custom_gradient
    def expectation(q, k, v):
        q32, k32 = ops.cast(q, compute), keep_rows(km, ops.cast(k, compute))
        v32 = keep_rows(km, ops.cast(v, compute))
        x, e = collision.expectation_weights(q32, k32, tau)
        e = e * ops.cast(pair_mask, compute)

        def grad(*args, upstream=None):
            dy32 = keep_rows(qm, ops.cast(_backend.upstream_gradient(args, upstream), compute))
            dyv = ops.einsum("bid,bjd->bij", dy32, v32)
            if backward == "lower_bound":
                w = dyv * e * (tau / 2.0)
            else:
                w = dyv * collision.collision_derivative(x, tau, _validation.COLLISION_EPSILON) * ops.cast(
                    pair_mask, compute)
            dq = ops.einsum("bij,bjd->bid", w, k32)
            dk = ops.einsum("bij,bid->bjd", w, q32)
            dv = ops.einsum("bij,bid->bjd", e, dy32)
            return ops.cast(dq, q.dtype), ops.cast(dk, k.dtype), ops.cast(dv, v.dtype)

        return ops.cast(ops.einsum("bij,bjd->bid", e, v32), dtype), grad

    return expectation(query, key, value)


def yoso_expectation_weights(query, key, hash_code_len, query_mask=None, key_mask=None):
    """The YOSO-E attention matrix E_ij = (1 - acos(<Q_i, K_j>)/pi)^tau (§3.1), O(Nq Nk) memory.

    Cosines are clipped to [-1, 1]; entries of masked queries or keys are 0.
    query `[B, Nq, d]`, key `[B, Nk, d]` (unit rows), masks `[B, N]`.
    Returns float32 `[B, Nq, Nk]`; `yoso_expectation` computes E @ V with the same weights.
    """
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=False)
    query, key, _, qm, km = _validation.dense_attention_inputs(query, key, None, query_mask, key_mask)
    key32 = keep_rows(km, ops.cast(key, "float32"))
    weights = collision.expectation_weights(ops.cast(query, "float32"), key32, hash_code_len)[1]
    return weights * ops.cast(ops.logical_and(qm[:, :, None], km[:, None, :]), "float32")



def yoso_decoding_state(batch_size, num_hashes, hash_code_len, value_dim):
    """The decoding state of causal YOSO before any position: zero bucket tables
    `[batch_size, num_hashes, 2**hash_code_len, value_dim]` float32 (T_h[b] = the sum of the values
    of the earlier keys with code b in hash h: 4 B m 2^tau D bytes, whatever the context length).
    `lsh_cumulation_step` reads and extends it. Tables over
    `keras_yoso._validation.MAX_DECODING_STATE_BYTES` (4 GiB) raise ValueError naming their size."""
    batch_size = _validation.integer(batch_size, "batch_size", 1)
    num_hashes = _validation.integer(num_hashes, "num_hashes", 1)
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=True)
    value_dim = _validation.integer(value_dim, "value_dim", 1)
    _validation.check_decoding_state(
        4 * batch_size * num_hashes * 2 ** hash_code_len * value_dim,
        f"yoso_decoding_state: its bucket tables, 4 bytes * batch_size {batch_size} * num_hashes {num_hashes} * "
        f"2**hash_code_len {2 ** hash_code_len} * value_dim {value_dim},",
        "lower hash_code_len (each bit doubles the tables), num_hashes, value_dim or batch_size")
    return ops.zeros((batch_size, num_hashes, 2 ** hash_code_len, value_dim), "float32")


def lsh_cumulation_step(query_codes, key_codes, value, tables, query_mask=None, key_mask=None,
                        implementation="auto"):
    """Causal YOSO of T new positions over the bucket tables of the earlier ones (decoding).

    eq. 2 with fixed hash functions is linear attention with one-hot features, so the earlier
    positions reach a query only through `tables` T_h[b] = sum of their values with code b in
    hash h (`yoso_decoding_state`, then the previous step's output): in position order, key t's
    value joins its bucket, then query t reads its bucket,

        out[b, t] = qmask[b, t] (1/m) sum_h (T_h[qc_hbt] + sum_{j <= t, kept, kc_hbj = qc_hbt} v_j),

    the rows `lsh_cumulation(..., causal=True)` gives for these positions after the earlier ones.
    Time O(B m (T + 2^tau) D) (the tables are copied unless a compiled loop updates them in place),
    memory the tables. Not differentiable (a decoding op).

    Args:
      query_codes, key_codes: int `[B, m, T]` of the new positions (the same positions: query t
        is key t), in [0, num_buckets).
      value: float `[B, T, D]`.
      tables: float32 `[B, m, num_buckets, D]`, num_buckets = 2**hash_code_len known statically.
      query_mask, key_mask: `[B, T]` or None; masked queries output 0, masked keys join no table.
      implementation: "auto", "custom_op" or "composite".

    Returns:
      (`[B, T, D]` in value's dtype, the new tables `[B, m, num_buckets, D]` float32).
    """
    tables = _validation.float_tensor(tables, "tables", 4)
    try:
        num_buckets = _validation.num_buckets(_backend.static_shape(tables)[2])
    except ValueError:  # the one rule for num_buckets, said of the tensor it is read from
        raise ValueError("tables must have shape [batch, num_hashes, num_buckets, value_dim] with num_buckets a power "
                         f"of two in [1, 2**{_validation.MAX_NUM_BUCKETS_LOG2}] known statically (axis 2), got shape "
                         f"{_backend.static_shape(tables)}") from None
    value = _validation.float_tensor(value, "value", 3)
    # The step has no direction attribute (its kernels add keys in position order): the provider is asked for it
    # as for any call; asked with CAUSAL, a GPU build with the Triton kernels was passed over (2026-11-29).
    provider = _dispatch.provider(implementation, (value, tables), _spec.BIDIRECTIONAL, ("lsh_cumulation_step",))
    qc, kc, qm, km, _, (value,) = _prepare_sides(query_codes, key_codes, query_mask, key_mask, [],
                                                 [("value", value)], num_buckets, provider, causal=_spec.CAUSAL)
    checks = _validation.agree([("query_codes", qc, 0), ("tables", tables, 0)], "batch sizes (axis 0) of the codes "
                               "and tables")
    checks += _validation.agree([("query_codes", qc, 1), ("tables", tables, 1)], "num_hashes (axis 1 of the codes "
                                "and tables)")
    checks += _validation.agree([("value", value, 2), ("tables", tables, 3)], "value widths (axis 2 of value, "
                                "axis 3 of tables)")
    tables, = _backend.after(checks, [ops.cast(tables, "float32")])
    names = _spec.PRIMITIVES["lsh_cumulation_step"].input_names
    out, tables = _dispatch.on_mesh(provider, lambda p, *t: p.run("lsh_cumulation_step", *t),
                                    (qm, qc, km, kc, value, tables), _roles(*names),
                                    [_spec.ROWS_ROLES, _spec.TABLES_ROLES], split_sequence=False)
    return ops.cast(out, value.dtype), tables
