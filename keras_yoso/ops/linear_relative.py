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
each neighbour (`_sequence_parallel_total`).
"""

from keras import ops

from keras_yoso import _runtime
from keras_yoso import _validation
from keras_yoso.ops import _sharding

DEFAULT_CHUNK_SIZE = 64


def elu_plus_one(x):
    """phi(x) = elu(x) + 1 > 0, as `where(x > 0, x + 1, exp(min(x, 0)))` (no cancellation in bf16)."""
    return ops.where(ops.greater(x, 0), x + 1, ops.exp(ops.minimum(x, ops.zeros((), x.dtype))))


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


def _pad_rows(x, length):
    """Zero rows appended to axis 1 of `x` [B, N, ...] up to `length` (>= N)."""
    shape = ops.shape(x)
    extra = ops.zeros((shape[0], length - shape[1]) + tuple(shape[2:]), x.dtype)
    return ops.concatenate([x, extra], axis=1)


def _chunk_rows(chunk_size, q_len):
    """Rows per chunk: `chunk_size` (default 64) clamped to [1, Lq], so a large chunk_size never
    allocates more than one dense Lq x Lq block. A Python int when Lq is static, else a scalar tensor."""
    chunk = chunk_size or DEFAULT_CHUNK_SIZE
    if isinstance(q_len, int):
        return max(1, min(chunk, q_len))
    return ops.clip(q_len, 1, chunk)


def _exclusive_cumsum(x):
    """sum_{n' < n} x[:, n'] along axis 1, exactly (a shifted cumsum: cumsum - x would carry the
    rounding of x[:, n] itself, i.e. of the chunk's future keys, into causal outputs)."""
    return ops.concatenate([ops.zeros_like(x[:, :1]), ops.cumsum(x, axis=1)[:, :-1]], axis=1)


def _causal_kernel_term(q, k, v, chunk):
    """sum_{j <= i} <q_i, k_j> v_j in chunks of `chunk` rows: [B, Lq, d], [B, Lk, d], [B, Lk, e] -> [B, Lq, e].

    Keys past the last query are never attended, so keys are aligned to Lq first.
    """
    batch, q_len = ops.shape(q)[0], ops.shape(q)[1]
    d, e = q.shape[-1], v.shape[-1]
    k, v = k[:, :q_len], v[:, :q_len]
    num_chunks = (q_len + chunk - 1) // chunk
    padded = num_chunks * chunk
    qc = ops.reshape(_pad_rows(q, padded), (batch, num_chunks, chunk, d))
    # When Lk < Lq the keys are shorter: pad them to the chunked query length too.
    kc = ops.reshape(_pad_rows(k, padded), (batch, num_chunks, chunk, d))
    vc = ops.reshape(_pad_rows(v, padded), (batch, num_chunks, chunk, e))
    rows = ops.arange(chunk)
    lower = ops.cast(ops.greater_equal(rows[:, None], rows[None, :]), "float32")
    scores = ops.einsum("bnid,bnjd->bnij", qc, kc) * lower
    intra = ops.einsum("bnij,bnje->bnie", scores, vc)
    states = ops.einsum("bnjd,bnje->bnde", kc, vc)                 # [B, L/C, d, e]
    before = _exclusive_cumsum(states)
    inter = ops.einsum("bnid,bnde->bnie", qc, before)
    return ops.reshape(intra + inter, (batch, padded, e))[:, :q_len]


def _band_gather_index(chunk, horizon, causal):
    """Flat index into [C * (2k+1) + 1] giving the [C, C + 2k] band of scores (last slot = 0).

    Query i of a chunk and window key t (absolute offset t - k - i) use score row t - i.
    """
    width = 2 * horizon + 1
    i = ops.arange(chunk)[:, None]
    t = ops.arange(chunk + 2 * horizon)[None, :]
    row = t - i
    valid = ops.logical_and(ops.greater_equal(row, 0), ops.less(row, width))
    if causal:
        valid = ops.logical_and(valid, ops.less_equal(row, horizon))
    return ops.reshape(ops.where(valid, i * width + row, chunk * width), (-1,))


def _relative_term(w, v, horizon, causal, chunk, key_offset=0):
    """sum_j <phi(Q_i), phi(RP_r(i,j))> v_j (Algorithm 2): w [B, Lq, 2k+1], v [B, Lk, e] -> [B, Lq, e].

    Query i sits at key position p = i + key_offset (a static int >= 0; 0 for self-attention,
    the window length when decoding). Keys j < p - k share row 0 (a prefix sum of v), keys
    j > p + k share row 2k (a suffix sum); the keys p - k .. p + k are a banded product per chunk.
    """
    batch, q_len = ops.shape(w)[0], ops.shape(w)[1]
    k_len = ops.shape(v)[1]
    width, e = 2 * horizon + 1, v.shape[-1]
    positions = ops.arange(q_len) + key_offset
    zero_row = ops.zeros_like(v[:, :1])
    cumulative = ops.cumsum(v, axis=1)
    prefix = ops.concatenate([zero_row, cumulative], axis=1)                  # prefix[t] = sum_{j < t} v_j
    out = w[:, :, :1] * ops.take(prefix, ops.clip(positions - horizon, 0, k_len), axis=1)
    if not causal:
        reverse = ops.flip(ops.cumsum(ops.flip(v, axis=1), axis=1), axis=1)
        suffix = ops.concatenate([reverse, zero_row], axis=1)                 # suffix[t] = sum_{j >= t} v_j
        out = out + w[:, :, -1:] * ops.take(suffix, ops.clip(positions + horizon + 1, 0, k_len), axis=1)

    num_chunks = (q_len + chunk - 1) // chunk
    padded = num_chunks * chunk
    window = chunk + 2 * horizon
    w_flat = ops.reshape(_pad_rows(w, padded), (batch, num_chunks, chunk * width))
    w_flat = ops.concatenate([w_flat, ops.zeros_like(w_flat[:, :, :1])], axis=2)
    band = ops.take(w_flat, _band_gather_index(chunk, horizon, causal), axis=2)
    band = ops.reshape(band, (batch, num_chunks, chunk, window))
    # v shifted by k so that window t of chunk c is key key_offset + c * C - k + t; zeros outside [0, Lk).
    needed = key_offset + padded + 2 * horizon
    shifted = ops.concatenate([ops.zeros((batch, horizon, e), v.dtype), v,
                               ops.zeros((batch, needed, e), v.dtype)], axis=1)[:, :needed]
    window_index = key_offset + ops.arange(num_chunks)[:, None] * chunk + ops.arange(window)[None, :]
    windows = ops.take(shifted, ops.reshape(window_index, (-1,)), axis=1)
    windows = ops.reshape(windows, (batch, num_chunks, window, e))             # [B, L/C, C + 2k, e]
    banded = ops.einsum("bnit,bnte->bnie", band, windows)
    return out + ops.reshape(banded, (batch, padded, e))[:, :q_len]


def _check_inputs(query, key, value, query_mask, key_mask, relative_embeddings, horizon):
    """query/key/value as float tensors, the [B, L] bool masks (all true when None) and the relative
    embeddings, or ValueError / TypeError naming the argument. Returns them and the run-time checks."""
    query = _validation.float_tensor(query, "query", 3)
    key = _validation.float_tensor(key, "key", 3)
    value = _validation.float_tensor(value, "value", 3)
    shape = _runtime.static_shape
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


def _features(query, key, value, q_mask, k_mask):
    """phi(Q) [B, Lq, d], phi(K) [B, Lk, d] and [V | 1] [B, Lk, dv + 1] in float32, zero on padded rows."""
    # where on the inputs, not a product on the outputs: padded rows may hold NaN or Inf, and must
    # reach neither an output nor (through phi's derivative) a gradient.
    keep_q, keep = q_mask[:, :, None], k_mask[:, :, None]
    phi_q = ops.where(keep_q, elu_plus_one(ops.where(keep_q, ops.cast(query, "float32"), 0.0)), 0.0)
    phi_k = ops.where(keep, elu_plus_one(ops.where(keep, ops.cast(key, "float32"), 0.0)), 0.0)
    ones = ops.ones((ops.shape(value)[0], ops.shape(value)[1], 1), "float32")
    v = ops.where(keep, ops.concatenate([ops.cast(value, "float32"), ones], axis=-1), 0.0)  # [..., dv | 1]
    return phi_q, phi_k, v


def _relative_scores(phi_q, rel):
    """W = phi(Q) phi(RP)^T (Algorithm 2): [B, Lq, d] and [2k+1, d] or [B, 2k+1, d] -> [B, Lq, 2k+1]."""
    phi_rel = elu_plus_one(ops.cast(rel, "float32"))
    if len(_runtime.static_shape(phi_rel)) == 2:
        return ops.einsum("bid,rd->bir", phi_q, phi_rel)
    return ops.einsum("bid,brd->bir", phi_q, phi_rel)


def _normalize(total, q_mask, epsilon):
    """eq. 10: numerator / (denominator + epsilon) from `total` [..., dv | denominator]; padded queries 0."""
    numerator, denominator = total[..., :-1], total[..., -1:]
    return ops.where(q_mask[:, :, None], numerator / (denominator + epsilon), 0.0)


def linear_relative_attention(query, key, value, relative_embeddings=None, horizon=None, causal=False,
                              query_mask=None, key_mask=None, epsilon=1e-6, chunk_size=None):
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
    query, key, value, q_mask, k_mask = _runtime.after(checks, [query, key, value, q_mask, k_mask])
    phi_q, phi_k, v = _features(query, key, value, q_mask, k_mask)

    scores = None if rel is None else _relative_scores(phi_q, rel)
    active = _sharding.plan()
    # Positions meet across blocks through sums only when queries and keys share positions (or
    # neither the order nor the distance matters): else XLA partitions the whole-sequence form.
    same_positions = _runtime.static_shape(query)[1] == _runtime.static_shape(key)[1]
    if active is not None and active.seq is not None and (same_positions or (not causal and scores is None)):
        total = _sequence_parallel_total(active, phi_q, phi_k, v, scores, horizon, causal, chunk_size)
    else:
        total = _total(phi_q, phi_k, v, scores, horizon, causal, _chunk_rows(chunk_size, ops.shape(query)[1]))
    return ops.cast(_normalize(total, q_mask, epsilon), out_dtype)


def _total(phi_q, phi_k, v, scores, horizon, causal, chunk):
    """The numerator and denominator rows [B, Lq, dv + 1] of eq. 10: kernel term plus relative term."""
    if causal:
        total = _causal_kernel_term(phi_q, phi_k, v, chunk)
    else:
        state = ops.einsum("bjd,bje->bde", phi_k, v)
        total = ops.einsum("bid,bde->bie", phi_q, state)
    if scores is not None:
        total = total + _relative_term(scores, v, horizon, causal, chunk)
    return total


def _sequence_parallel_total(active, phi_q, phi_k, v, scores, horizon, causal, chunk_size):
    """`_total` with the sequence split over the mesh axis `active.seq` (P devices, blocks of n rows).

    Device s holds positions s n .. (s + 1) n - 1 of queries and keys (self-attention). Kernel term:
    S = sum_j phi(K_j) (x) [V_j, 1] is a sum, so one psum (bidirectional), or the sum over the
    earlier devices plus the local causal term (an exclusive scan over the devices). Relative term: the
    k rows of [V, 1] just before and after the block come from the neighbours (two ppermutes, the
    horizon halo), the band is computed on [halo, block, halo], and the keys beyond the halo
    share rows 0 and 2k, i.e. the totals of the devices before (after) minus the halo (exclusive
    scans of the [B, dv + 1] block totals). Needs n >= k (ValueError); Lq == Lk unless bidirectional
    without relative positions (the caller keeps other sequences whole).
    """
    size, axis = active.seq_size, active.seq
    lengths = (_runtime.static_shape(phi_q)[1], _runtime.static_shape(phi_k)[1])
    for length, name in zip(lengths, ("query", "key")):
        _sharding.sequence_length_check(active, length, f"the {name}")
    if scores is not None and lengths[0] is not None and lengths[0] // size < horizon:
        raise ValueError(f"sequence parallelism over {size} devices gives each device {lengths[0] // size} "
                         f"positions of the {lengths[0]}, fewer than horizon={horizon}: the relative-position halo "
                         f"comes from one neighbour, so the length must be at least {size} * {horizon} = "
                         f"{size * horizon}")

    def block(phi_q, phi_k, v, *scores):
        chunk = _chunk_rows(chunk_size, ops.shape(phi_q)[1])
        local = ops.einsum("bjd,bje->bde", phi_k, v)
        if causal:
            earlier = _sharding.exclusive_scan(local, axis, size)
            total = _causal_kernel_term(phi_q, phi_k, v, chunk) + ops.einsum("bid,bde->bie", phi_q, earlier)
        else:
            total = ops.einsum("bid,bde->bie", phi_q, _sharding.psum(local, axis))
        if not scores:
            return total
        w, = scores
        before_halo = _sharding.from_neighbour(v[:, -horizon:], axis, size, 1)
        after_halo = ops.zeros_like(before_halo) if causal else _sharding.from_neighbour(v[:, :horizon], axis, size,
                                                                                       -1)
        keys = ops.concatenate([before_halo, v, after_halo], axis=1)
        total = total + _relative_term(w, keys, horizon, causal, chunk, key_offset=horizon)
        block_total = ops.sum(v, axis=1)
        earlier = _sharding.exclusive_scan(block_total, axis, size)
        total = total + w[:, :, :1] * (earlier - ops.sum(before_halo, axis=1))[:, None, :]
        if not causal:
            later = _sharding.exclusive_scan(block_total, axis, size, -1)
            total = total + w[:, :, -1:] * (later - ops.sum(after_halo, axis=1))[:, None, :]
        return total

    rows = ("batch", "seq", None)
    args = (phi_q, phi_k, v) + (() if scores is None else (scores,))
    return _sharding.run(active, block, args, (rows,) * len(args), rows)


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
    depth, value_depth = _runtime.static_shape(query)[2], _runtime.static_shape(value)[2]
    expected = linear_relative_decoding_state_shapes(depth, value_depth, horizon)
    if not isinstance(state, dict) or set(state) != set(expected):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"state must be a dict with the entries {sorted(expected)} (horizon={horizon}), as "
                         f"linear_relative_decoding_state returns; got {got}")
    checked, checks = {}, []
    for name, shape in expected.items():
        tensor = _validation.float_tensor(state[name], f"state[{name!r}]", 1 + len(shape))
        got = _runtime.static_shape(tensor)
        if tuple(got[1:]) != shape:
            raise ValueError(f"state[{name!r}] must have shape [batch, {', '.join(map(str, shape))}] for "
                             f"depth={depth}, value_depth={value_depth}, horizon={horizon}; got shape {tuple(got)}")
        checks += _validation.agree([("query axis 0", query, 0), (f"state[{name!r}] axis 0", tensor, 0)],
                                    "batch sizes")
        checked[name] = ops.cast(tensor, "float32")
    return checked, checks


def linear_relative_attention_step(query, key, value, state, relative_embeddings=None, horizon=None,
                                   query_mask=None, key_mask=None, epsilon=1e-6, chunk_size=None):
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
    query, key, value, q_mask, k_mask = _runtime.after(checks + state_checks, [query, key, value, q_mask, k_mask])
    phi_q, phi_k, v = _features(query, key, value, q_mask, k_mask)

    chunk = _chunk_rows(chunk_size, ops.shape(query)[1])
    kernel_state = state["kernel_state"]
    total = ops.einsum("bid,bde->bie", phi_q, kernel_state) + _causal_kernel_term(phi_q, phi_k, v, chunk)
    new_state = {"kernel_state": kernel_state + ops.einsum("bjd,bje->bde", phi_k, v)}
    if rel is not None:
        scores = _relative_scores(phi_q, rel)
        # Positions n - k .. n + T - 1; new query t sits at row t + k.
        keys = ops.concatenate([state["window"], v], axis=1)
        total = (total + scores[:, :, :1] * state["before_window"][:, None, :]
                 + _relative_term(scores, keys, horizon, True, chunk, key_offset=horizon))
        # Always k rows; the reshape keeps that static when T is not (a TensorFlow graph).
        new_state["window"] = ops.reshape(keys[:, -horizon:], (-1, horizon, keys.shape[-1]))
        new_state["before_window"] = state["before_window"] + ops.sum(keys[:, :-horizon], axis=1)
    return ops.cast(_normalize(total, q_mask, epsilon), out_dtype), new_state
