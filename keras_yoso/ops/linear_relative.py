"""Linear-cost kernelized attention with relative positions (Scaleformer), in `keras.ops`.

Paper: Favier & Dal'Maz Silva, "Scaleformer: linear complexity kernelized attention with
relative positional encoding", 2022 (eq. 9-11, Algorithms 1-2).

Contract, for query i and key j, phi(x) = elu(x) + 1 and horizon k:

    r(i, j) = clip(j - i, -k, k) + k                      (row k: same position)
    S_ij    = <phi(Q_i), phi(K_j)> + <phi(Q_i), phi(RP_r(i,j))>       (eq. 9, 11)
    out_i   = sum_j S_ij V_j / (sum_j S_ij + epsilon)                 (eq. 10)

summed over unpadded keys j (and j <= i when causal, top-left aligned). Padded queries
output 0. Every mode costs O(L) time and memory in the sequence length:

- kernel term, bidirectional: one [d, dv] state (Algorithm 1 without the mask);
- kernel term, causal: chunks of C queries; inside a chunk the masked C x C product, across
  chunks an exclusive prefix sum of per-chunk phi(K) (x) V states ([L/C, d, dv], never the
  [L, d, dv] of Algorithm 1);
- relative term (Algorithm 2): the keys before the horizon share row 0 and the keys after it
  share row 2k, so they are prefix / suffix sums of V weighted by one score per query; the
  2k+1 keys inside the horizon are a banded product, computed per chunk of C queries against
  its C + 2k key window.
- incremental decoding (`linear_relative_attention_step`): causal attention of the next T
  positions over a fixed-size state (the kernel state, the last k value rows and the sum of the
  earlier ones), O(1) memory in the number of positions seen.

The denominator rides along as an extra all-ones value column (masked like the values), so it
goes through the same sums: width d in the kernel states, not d * dv. Everything is computed
in float32; the output has value's dtype. One implementation on every backend (there is no
custom op for it: `benchmarks/linear_relative_op.py` shows these ops are fast enough).

Under `keras_yoso.distribution.SequenceParallel` (JAX), `linear_relative_attention` splits the
sequence over the mesh: a psum (or exclusive scan) of the kernel state and a `horizon` halo from
each neighbour (`parallel/linear_relative_halo.block_total`).
"""

from keras import ops

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec
from keras_yoso.ops.composite import linear_relative as composite


def _check_options(relative_embeddings, horizon, causal, epsilon, chunk_size):
    horizon = _validation.integer(horizon, "horizon", 1, allow_none=True)
    if (horizon is None) != (relative_embeddings is None):
        raise ValueError("relative_embeddings and horizon go together: pass both (relative_embeddings of shape "
                         "[2 * horizon + 1, d]) or neither (plain linear attention). Received "
                         f"horizon={horizon!r} and relative_embeddings "
                         f"{'None' if relative_embeddings is None else 'set'}")
    causal = _validation.boolean(causal, "causal")
    epsilon = _validation.positive_float(epsilon, "epsilon", why=" (it keeps rows without keys at 0, not NaN)")
    chunk_size = _validation.integer(chunk_size, "chunk_size", 1, allow_none=True)
    return horizon, causal, epsilon, chunk_size


def _check_inputs(query, key, value, query_mask, key_mask, relative_embeddings, horizon):
    """query/key/value as float tensors, the [B, L] bool masks (all true when None) and the relative
    embeddings, or ValueError / TypeError naming the argument. Returns them and the run-time checks."""
    query = _validation.float_tensor(query, "query", 3)
    key = _validation.float_tensor(key, "key", 3)
    value = _validation.float_tensor(value, "value", 3)
    shape = _backend.static_shape
    checks = _validation.agree([("query axis 0", query, 0), ("key axis 0", key, 0), ("value axis 0", value, 0)],
                               "batch sizes")
    checks += _validation.agree([("key axis 1", key, 1), ("value axis 1", value, 1)], "key and value lengths")
    _validation.dims_agree([("query axis 2", shape(query)[2]), ("key axis 2", shape(key)[2])], "query and key depths")
    if shape(query)[2] is None or shape(value)[2] is None:
        raise ValueError(f"the last dimension of query, key and value must be known, got query {shape(query)}, "
                         f"key {shape(key)}, value {shape(value)}")
    batch = ops.shape(query)[0]
    masks = []
    for name, mask, tensor, what in (("query_mask", query_mask, query, "query lengths"),
                                     ("key_mask", key_mask, key, "key lengths")):
        if mask is None:
            masks.append(ops.ones((batch, ops.shape(tensor)[1]), "bool"))
            continue
        mask = _validation.mask_tensor(mask, name)
        label = name.split("_")[0]
        checks += _validation.agree([(f"{label} axis 0", tensor, 0), (f"{name} axis 0", mask, 0)], "batch sizes")
        checks += _validation.agree([(f"{label} axis 1", tensor, 1), (f"{name} axis 1", mask, 1)], what)
        masks.append(mask)
    q_mask, k_mask = masks

    rel = None
    if horizon is not None:
        rank = len(shape(relative_embeddings)) if shape(relative_embeddings) is not None else None
        if rank not in (2, 3):
            raise ValueError("relative_embeddings must have shape [2 * horizon + 1, d] or [batch, 2 * horizon + 1, "
                             f"d], got shape {shape(relative_embeddings)}")
        rel = _validation.float_tensor(relative_embeddings, "relative_embeddings", rank)
        rows = shape(rel)[-2]
        if rows is not None and rows != 2 * horizon + 1:
            raise ValueError(f"relative_embeddings must have 2 * horizon + 1 = {2 * horizon + 1} rows (axis "
                             f"{rank - 2}) for horizon={horizon}, got shape {shape(rel)}")
        _validation.dims_agree([("query axis 2", shape(query)[2]), ("relative_embeddings last axis", shape(rel)[-1])],
                               "query and relative_embeddings depths")
        if rank == 3:
            checks += _validation.agree([("query axis 0", query, 0), ("relative_embeddings axis 0", rel, 0)],
                                        "batch sizes")
    return query, key, value, q_mask, k_mask, rel, checks


def linear_relative_attention(query, key, value, relative_embeddings=None, horizon=None, causal=False,
                              query_mask=None, key_mask=None, epsilon=_validation.LINEAR_RELATIVE_EPSILON,
                              chunk_size=None):
    """Kernelized attention with Shaw relative positions in O(L) (Scaleformer eq. 9-11).

    Args:
        query: `[B, Lq, d]` raw queries (phi is applied inside).
        key: `[B, Lk, d]` raw keys.
        value: `[B, Lk, dv]` values.
        relative_embeddings: `[2k+1, d]` (shared over the batch) or `[B, 2k+1, d]` raw relative
            position embeddings; row k is "same position", rows < k are keys before the query.
            None with `horizon=None` for plain linear attention.
        horizon: k >= 1, the clipping distance of relative positions, or None.
        causal: If True, query i attends only to keys j <= i.
        query_mask: Optional `[B, Lq]` padding mask (nonzero keeps); padded queries output 0.
        key_mask: Optional `[B, Lk]` padding mask; padded keys are dropped from numerator and
            denominator (their values never reach an output).
        epsilon: > 0, added to the denominator (eq. 10), so rows without any key output 0.
        chunk_size: Rows per chunk of the causal prefix sums and of the relative band (default
            64), clamped to Lq: a chunk_size >= Lq computes one dense masked Lq x Lq block;
            results agree for every chunk_size.

    Returns:
        `[B, Lq, dv]`, value's dtype (float32 accumulation).
    """
    horizon, causal, epsilon, chunk_size = _check_options(relative_embeddings, horizon, causal, epsilon, chunk_size)
    query, key, value, q_mask, k_mask, rel, checks = _check_inputs(query, key, value, query_mask, key_mask,
                                                                   relative_embeddings, horizon)
    out_dtype = value.dtype
    query, key, value, q_mask, k_mask = _backend.after(checks, [query, key, value, q_mask, k_mask])
    phi_q, phi_k, v = composite.features(query, key, value, q_mask, k_mask)

    scores = None if rel is None else composite.relative_scores(phi_q, rel)
    # Positions meet across blocks through sums only when queries and keys share positions (or
    # neither the order nor the distance matters): else XLA partitions the whole-sequence form.
    same_positions = _backend.static_shape(query)[1] == _backend.static_shape(key)[1]
    args = (phi_q, phi_k, v) + (() if scores is None else (scores,))
    rows = _spec.ROWS_ROLES
    total = _dispatch.on_mesh(
        _dispatch.provider("composite"),
        lambda p, phi_q, phi_k, v, scores=None: p.linear_relative_total(phi_q, phi_k, v, scores, horizon, causal,
                                                                       chunk_size),
        args, [rows] * len(args), rows, split_sequence=same_positions or (not causal and scores is None))
    return ops.cast(composite.normalize(total, q_mask, epsilon), out_dtype)


# ---------------------------------------------------------------------------- incremental decoding

def linear_relative_decoding_state_shapes(depth, value_depth, horizon=None):
    """The per-sequence shapes of the decoding state, by name (see `linear_relative_decoding_state`)."""
    depth = _validation.integer(depth, "depth", 1)
    value_depth = _validation.integer(value_depth, "value_depth", 1)
    horizon = _validation.integer(horizon, "horizon", 1, allow_none=True)
    shapes = {"kernel_state": (depth, value_depth + 1)}
    if horizon is not None:
        shapes["window"] = (horizon, value_depth + 1)
        shapes["before_window"] = (value_depth + 1,)
    return shapes


def linear_relative_decoding_state(batch_shape, depth, value_depth, horizon=None):
    """The decoding state of `linear_relative_attention_step` before any position: float32 zeros.

    With phi(x) = elu(x) + 1, relative horizon k and [V_j, 1] the value row of position j with the
    denominator's all-ones column appended (eq. 10), after positions 0 .. n-1 the state holds:

    - "kernel_state" `[*batch_shape, depth, value_depth + 1]`: sum_j phi(K_j) (x) [V_j, 1], the
      prefix sum of eq. 8 (its last column is the denominator's sum_j phi(K_j));
    - with a horizon, "window" `[*batch_shape, k, value_depth + 1]`: [V_j, 1] of positions
      n - k .. n - 1, oldest first (zero rows stand for positions before 0);
    - with a horizon, "before_window" `[*batch_shape, value_depth + 1]`: sum of [V_j, 1] over
      positions j < n - k, which every later query weighs with relative row 0 (eq. 11: clip).

    That is all the causal relative term needs: query i >= n sees the keys j <= i - k through
    row 0 and the k keys i - k + 1 .. i through rows 1 .. k. The state does not grow with n:
    4 * prod(batch_shape) * (value_depth + 1) * (depth + k + 1) bytes, or
    4 * prod(batch_shape) * (value_depth + 1) * depth without a horizon.

    Args:
        batch_shape: Tuple of leading dims: `(B,)` for the op, `(B, heads)` for a layer.
        depth: d, the query/key depth.
        value_depth: dv, the value depth.
        horizon: k >= 1, or None (plain linear attention: "kernel_state" only).

    Returns:
        A dict of float32 zero tensors, the names above.
    """
    batch_shape = tuple(_validation.integer(n, "batch_shape entries", 1) for n in batch_shape)
    return {name: ops.zeros(batch_shape + shape, "float32")
            for name, shape in linear_relative_decoding_state_shapes(depth, value_depth, horizon).items()}


def _check_state(state, query, value, horizon):
    """`state` as a dict of float32 tensors of the shapes of `linear_relative_decoding_state((B,), ...)`
    for query/value, or ValueError naming the entry. Returns it and the run-time batch checks."""
    depth, value_depth = _backend.static_shape(query)[2], _backend.static_shape(value)[2]
    expected = linear_relative_decoding_state_shapes(depth, value_depth, horizon)
    if not isinstance(state, dict) or set(state) != set(expected):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"state must be a dict with the entries {sorted(expected)} (horizon={horizon}), as "
                         f"linear_relative_decoding_state returns; got {got}")
    checked, checks = {}, []
    for name, shape in expected.items():
        tensor = _validation.float_tensor(state[name], f"state[{name!r}]", 1 + len(shape))
        got = _backend.static_shape(tensor)
        if tuple(got[1:]) != shape:
            raise ValueError(f"state[{name!r}] must have shape [batch, {', '.join(map(str, shape))}] for "
                             f"depth={depth}, value_depth={value_depth}, horizon={horizon}; got shape {tuple(got)}")
        checks += _validation.agree([("query axis 0", query, 0), (f"state[{name!r}] axis 0", tensor, 0)],
                                    "batch sizes")
        checked[name] = ops.cast(tensor, "float32")
    return checked, checks


def linear_relative_attention_step(query, key, value, state, relative_embeddings=None, horizon=None,
                                   query_mask=None, key_mask=None, epsilon=_validation.LINEAR_RELATIVE_EPSILON,
                                   chunk_size=None):
    """Causal Scaleformer attention of T new positions over a constant-size state (eq. 8-11).

    Incremental decoding: the positions seen so far (0 .. n-1) are summarized by `state` (see
    `linear_relative_decoding_state`); `query`, `key` and `value` are the T >= 1 next positions
    n .. n+T-1 (a prefill chunk or one token). New query t attends to every earlier position and
    to new keys 0 .. t, so the outputs equal rows n .. n+T-1 of `linear_relative_attention(...,
    causal=True)` over the whole sequence, and the returned state summarizes positions 0 .. n+T-1.
    Relative positions depend only on distances, so n itself is never needed.

    Per new query i (position n + t), with phi(x) = elu(x) + 1 and [V_j, 1] as in eq. 10:

        kernel term (eq. 8):    phi(Q_i) . kernel_state + sum_{new j <= i} <phi(Q_i), phi(K_j)> [V_j, 1]
        relative term (eq. 11): W_i0 (before_window + sum_{j <= i - k in window or new} [V_j, 1])
                                + sum_{r=1..k} W_ir [V_{i-k+r}, 1],   W = phi(Q) phi(RP)^T

    The new positions are computed like the causal full forward (Algorithm 1 in chunks of C rows,
    the relative band of Algorithm 2 against the window followed by the new keys), with
    C = min(chunk_size, T): O(T ((C + k)(d + dv) + d dv)) time and O(T (C + k) + T d dv / C)
    temporaries per call (a prefill chunk of T <= chunk_size forms the masked T x T product: O(T^2));
    one token costs O(d dv + k (d + dv)). The state is O(1) in the number of positions seen.

    Args:
        query: `[B, T, d]` raw queries of the new positions.
        key: `[B, T, d]` raw keys of the new positions.
        value: `[B, T, dv]` values of the new positions.
        state: The dict of `linear_relative_decoding_state((B,), d, dv, horizon)` or of a previous step.
        relative_embeddings: `[2k+1, d]` or `[B, 2k+1, d]` raw relative position embeddings, as
            in `linear_relative_attention`; None with `horizon=None`.
        horizon: k >= 1, or None (plain causal linear attention).
        query_mask: Optional `[B, T]` padding mask of the new queries; padded queries output 0.
        key_mask: Optional `[B, T]` padding mask of the new keys; padded keys never enter the
            state (they still take their position, as in the full forward).
        epsilon: > 0, added to the denominator (eq. 10).
        chunk_size: Rows per chunk within the new positions (default 64); results do not depend on it.

    Returns:
        `(output, state)`: output `[B, T, dv]` in value's dtype, and the new state (same names,
        shapes and dtype float32).
    """
    horizon, _, epsilon, chunk_size = _check_options(relative_embeddings, horizon, True, epsilon, chunk_size)
    query, key, value, q_mask, k_mask, rel, checks = _check_inputs(query, key, value, query_mask, key_mask,
                                                                   relative_embeddings, horizon)
    checks += _validation.agree([("query axis 1", query, 1), ("key axis 1", key, 1)], "query and key lengths")
    state, state_checks = _check_state(state, query, value, horizon)
    out_dtype = value.dtype
    query, key, value, q_mask, k_mask = _backend.after(checks + state_checks, [query, key, value, q_mask, k_mask])
    phi_q, phi_k, v = composite.features(query, key, value, q_mask, k_mask)

    chunk = composite.chunk_rows(chunk_size, ops.shape(query)[1])
    kernel_state = state["kernel_state"]
    total = ops.einsum("bid,bde->bie", phi_q, kernel_state) + composite.causal_kernel_term(phi_q, phi_k, v, chunk)
    new_state = {"kernel_state": kernel_state + ops.einsum("bjd,bje->bde", phi_k, v)}
    if rel is not None:
        scores = composite.relative_scores(phi_q, rel)
        # Positions n - k .. n + T - 1; new query t sits at row t + k.
        keys = ops.concatenate([state["window"], v], axis=1)
        total = (total + scores[:, :, :1] * state["before_window"][:, None, :]
                 + composite.relative_term(scores, keys, horizon, True, chunk, key_offset=horizon))
        # Always k rows; the reshape keeps that static when T is not (a TensorFlow graph).
        new_state["window"] = ops.reshape(keys[:, -horizon:], (-1, horizon, keys.shape[-1]))
        new_state["before_window"] = state["before_window"] + ops.sum(keys[:, :-horizon], axis=1)
    return ops.cast(composite.normalize(total, q_mask, epsilon), out_dtype), new_state
