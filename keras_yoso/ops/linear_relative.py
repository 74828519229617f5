"""Linear-cost kernelized attention with relative positions (Scaleformer).

Paper: Favier & Dal'Maz Silva, "Scaleformer: linear complexity kernelized
attention with relative positional encoding", 2022 (eq. 9-11, Algorithms 1-2).

Contract, for query i and key j, phi(x) = elu(x) + 1 and horizon k:

    r(i, j) = clip(j - i, -k, k) + k                      (row k: same position)
    S_ij    = <phi(Q_i), phi(K_j)> + <phi(Q_i), phi(RP_r(i,j))>       (eq. 9, 11)
    out_i   = sum_j S_ij V_j / (sum_j S_ij + epsilon)                 (eq. 10)

summed over unpadded keys j (and j <= i when causal, top-left aligned). Padded
queries output 0. Every mode costs O(L) time and memory in the sequence length:

- kernel term, bidirectional: one [d, dv] state (Algorithm 1 without the mask);
- kernel term, causal: chunks of C queries; inside a chunk the masked C x C
  product, across chunks an exclusive prefix sum of per-chunk phi(K) (x) V
  states ([L/C, d, dv], never the [L, d, dv] of Algorithm 1);
- relative term (Algorithm 2): the keys before the horizon share row 0 and the
  keys after it share row 2k, so they are prefix / suffix sums of V weighted by
  one score per query; the 2k+1 keys inside the horizon are a banded product,
  computed per chunk of C queries against its C + 2k key window.

The denominator rides along as an extra all-ones value column (masked like the
values), so it goes through the same sums: width d in the kernel states, not
d * dv. Everything is computed in float32; the output has value's dtype.
"""

import numbers

import numpy as np
import tensorflow as tf

from keras_yoso.ops.yoso import _check_same
from keras_yoso.ops.yoso import _float_tensor
from keras_yoso.ops.yoso import _mask_tensor

DEFAULT_CHUNK_SIZE = 64


def elu_plus_one(x):
    """phi(x) = elu(x) + 1 > 0, as `where(x > 0, x + 1, exp(min(x, 0)))` (no cancellation in bf16)."""
    return tf.where(x > 0, x + 1, tf.exp(tf.minimum(x, tf.zeros([], x.dtype))))


def _check_options(relative_embeddings, horizon, causal, epsilon, chunk_size):
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral)
                                or horizon < 1):
        raise ValueError(f"horizon must be None or an integer >= 1, got {horizon!r}")
    if (horizon is None) != (relative_embeddings is None):
        raise ValueError("relative_embeddings and horizon go together: pass both (relative_embeddings of shape "
                         "[2 * horizon + 1, d]) or neither (plain linear attention). Received "
                         f"horizon={horizon!r} and relative_embeddings "
                         f"{'None' if relative_embeddings is None else 'set'}")
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not epsilon > 0 or (
            not np.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite float > 0 (it keeps rows without keys at 0, not NaN), "
                         f"got {epsilon!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
                                   or chunk_size < 1):
        raise ValueError(f"chunk_size must be None or an integer >= 1, got {chunk_size!r}")


def _assert_dims_equal(tensors_axes, what):
    """Static check of the known dims, plus a run-time assert when any of them is unknown."""
    _check_same([(f"{name} axis {axis}", t.shape[axis]) for name, t, axis in tensors_axes], what)
    if all(t.shape[axis] is not None for _, t, axis in tensors_axes):
        return []
    first_name, first, first_axis = tensors_axes[0]
    return [tf.debugging.assert_equal(tf.shape(t)[axis], tf.shape(first)[first_axis],
                                      message=f"{what} must agree: {name} axis {axis} vs {first_name} "
                                              f"axis {first_axis}")
            for name, t, axis in tensors_axes[1:]]


def _pad_rows(x, length):
    """Zero-pads axis 1 of `x` [B, N, ...] up to `length` (>= N)."""
    paddings = tf.concat([[[0, 0], [0, length - tf.shape(x)[1]]],
                          tf.zeros([x.shape.rank - 2, 2], tf.int32)], axis=0)
    return tf.pad(x, paddings)


def _chunk_rows(chunk_size, query):
    """Rows per chunk: `chunk_size` (default 64) clamped to [1, Lq], so a large chunk_size never
    allocates more than one dense Lq x Lq block. A Python int when Lq is static, else a scalar tensor."""
    chunk = chunk_size or DEFAULT_CHUNK_SIZE
    q_len = query.shape[1]
    if q_len is not None:
        return max(1, min(chunk, q_len))
    return tf.clip_by_value(tf.shape(query)[1], 1, chunk)


def _causal_kernel_term(q, k, v, chunk):
    """sum_{j <= i} <q_i, k_j> v_j in chunks of `chunk` rows: [B, Lq, d], [B, Lk, d], [B, Lk, e] -> [B, Lq, e].

    Keys past the last query are never attended, so keys are aligned to Lq first.
    """
    batch, q_len = tf.shape(q)[0], tf.shape(q)[1]
    d, e = q.shape[-1], v.shape[-1]
    k, v = k[:, :q_len], v[:, :q_len]
    num_chunks = (q_len + chunk - 1) // chunk
    padded = num_chunks * chunk
    qc = tf.reshape(_pad_rows(q, padded), [batch, num_chunks, chunk, d])
    kc = tf.reshape(_pad_rows(k, padded), [batch, num_chunks, chunk, d])
    vc = tf.reshape(_pad_rows(v, padded), [batch, num_chunks, chunk, e])
    lower = tf.cast(tf.range(chunk)[:, None] >= tf.range(chunk)[None, :], tf.float32)
    scores = tf.einsum("bnid,bnjd->bnij", qc, kc) * lower
    intra = tf.einsum("bnij,bnje->bnie", scores, vc)
    states = tf.einsum("bnjd,bnje->bnde", kc, vc)                 # [B, L/C, d, e]
    before = tf.cumsum(states, axis=1, exclusive=True)
    inter = tf.einsum("bnid,bnde->bnie", qc, before)
    return tf.reshape(intra + inter, [batch, padded, e])[:, :q_len]


def _band_gather_index(chunk, horizon, causal):
    """Flat index into [C * (2k+1) + 1] giving the [C, C + 2k] band of scores (last slot = 0).

    Query i of a chunk and window key t (absolute offset t - k - i) use score row t - i.
    """
    width = 2 * horizon + 1
    i = tf.range(chunk)[:, None]
    t = tf.range(chunk + 2 * horizon)[None, :]
    row = t - i
    valid = (row >= 0) & (row < width)
    if causal:
        valid &= row <= horizon
    return tf.reshape(tf.where(valid, i * width + row, chunk * width), [-1])


def _relative_term(w, v, horizon, causal, chunk):
    """sum_j <phi(Q_i), phi(RP_r(i,j))> v_j (Algorithm 2): w [B, Lq, 2k+1], v [B, Lk, e] -> [B, Lq, e].

    Keys j < i - k share row 0 (a prefix sum of v), keys j > i + k share row 2k
    (a suffix sum); the keys i - k .. i + k are a banded product per chunk.
    """
    batch, q_len, k_len = tf.shape(w)[0], tf.shape(w)[1], tf.shape(v)[1]
    width, e = 2 * horizon + 1, v.shape[-1]
    positions = tf.range(q_len)
    prefix = tf.pad(tf.cumsum(v, axis=1), [[0, 0], [1, 0], [0, 0]])           # prefix[t] = sum_{j < t} v_j
    out = w[:, :, :1] * tf.gather(prefix, tf.clip_by_value(positions - horizon, 0, k_len), axis=1)
    if not causal:
        suffix = tf.pad(tf.cumsum(v, axis=1, reverse=True), [[0, 0], [0, 1], [0, 0]])  # sum_{j >= t} v_j
        out += w[:, :, -1:] * tf.gather(suffix, tf.clip_by_value(positions + horizon + 1, 0, k_len), axis=1)

    num_chunks = (q_len + chunk - 1) // chunk
    padded = num_chunks * chunk
    window = chunk + 2 * horizon
    w_flat = tf.reshape(_pad_rows(w, padded), [batch, num_chunks, chunk * width])
    w_flat = tf.pad(w_flat, [[0, 0], [0, 0], [0, 1]])
    band = tf.gather(w_flat, _band_gather_index(chunk, horizon, causal), axis=2)
    band = tf.reshape(band, [batch, num_chunks, chunk, window])
    # v shifted by k so that window t of chunk c is key c * C - k + t; zeros outside [0, Lk).
    v_shifted = tf.pad(v, [[0, 0], [horizon, 0], [0, 0]])[:, :padded + 2 * horizon]
    v_shifted = _pad_rows(v_shifted, padded + 2 * horizon)
    window_index = tf.range(num_chunks)[:, None] * chunk + tf.range(window)[None, :]
    windows = tf.gather(v_shifted, window_index, axis=1)                         # [B, L/C, C + 2k, e]
    banded = tf.einsum("bnit,bnte->bnie", band, windows)
    return out + tf.reshape(banded, [batch, padded, e])[:, :q_len]


def linear_relative_attention(query, key, value, relative_embeddings=None, horizon=None, causal=False,
                              query_mask=None, key_mask=None, epsilon=1e-6, chunk_size=None):
    """Kernelized attention with Shaw relative positions in O(L) (Scaleformer eq. 9-11).

    Args:
        query: `[B, Lq, d]` raw queries (phi is applied inside).
        key: `[B, Lk, d]` raw keys.
        value: `[B, Lk, dv]` values.
        relative_embeddings: `[2k+1, d]` (shared over the batch) or
            `[B, 2k+1, d]` raw relative position embeddings; row k is "same
            position", rows < k are keys before the query. None with
            `horizon=None` for plain linear attention.
        horizon: k >= 1, the clipping distance of relative positions, or None.
        causal: If True, query i attends only to keys j <= i.
        query_mask: Optional `[B, Lq]` padding mask (nonzero keeps); padded
            queries output 0.
        key_mask: Optional `[B, Lk]` padding mask; padded keys are dropped
            from numerator and denominator (their values never reach an output).
        epsilon: > 0, added to the denominator (eq. 10), so rows without any
            key output 0.
        chunk_size: Rows per chunk of the causal prefix sums and of the
            relative band (default 64), clamped to Lq: a chunk_size >= Lq
            computes one dense masked Lq x Lq block; results agree for every
            chunk_size.

    Returns:
        `[B, Lq, dv]`, value's dtype (float32 accumulation).
    """
    _check_options(relative_embeddings, horizon, causal, epsilon, chunk_size)
    query = _float_tensor(query, "query", 3)
    key = _float_tensor(key, "key", 3)
    value = _float_tensor(value, "value", 3)
    out_dtype = value.dtype
    checks = []
    checks += _assert_dims_equal([("query", query, 0), ("key", key, 0), ("value", value, 0)], "batch sizes")
    checks += _assert_dims_equal([("key", key, 1), ("value", value, 1)], "key and value lengths")
    _check_same([("query axis 2", query.shape[2]), ("key axis 2", key.shape[2])], "query and key depths")
    if query.shape[2] is None or value.shape[2] is None:
        raise ValueError(f"the last dimension of query, key and value must be known, got query {query.shape}, "
                         f"key {key.shape}, value {value.shape}")
    batch, q_len, k_len = tf.shape(query)[0], tf.shape(query)[1], tf.shape(key)[1]
    q_mask = _mask_tensor(query_mask, batch, q_len, "query_mask")
    k_mask = _mask_tensor(key_mask, batch, k_len, "key_mask")
    checks += _assert_dims_equal([("query", query, 0), ("query_mask", q_mask, 0)], "batch sizes")
    checks += _assert_dims_equal([("query", query, 1), ("query_mask", q_mask, 1)], "query lengths")
    checks += _assert_dims_equal([("key", key, 0), ("key_mask", k_mask, 0)], "batch sizes")
    checks += _assert_dims_equal([("key", key, 1), ("key_mask", k_mask, 1)], "key lengths")

    rel = None
    if horizon is not None:
        rel = tf.convert_to_tensor(relative_embeddings)
        if rel.shape.rank not in (2, 3):
            raise ValueError("relative_embeddings must have shape [2 * horizon + 1, d] or [batch, 2 * horizon + 1, "
                             f"d], got shape {rel.shape}")
        rel = _float_tensor(rel, "relative_embeddings", rel.shape.rank)
        if rel.shape[-2] is not None and rel.shape[-2] != 2 * horizon + 1:
            raise ValueError(f"relative_embeddings must have 2 * horizon + 1 = {2 * horizon + 1} rows (axis "
                             f"{rel.shape.rank - 2}) for horizon={horizon}, got shape {rel.shape}")
        _check_same([("query axis 2", query.shape[2]), ("relative_embeddings last axis", rel.shape[-1])],
                    "query and relative_embeddings depths")
        if rel.shape.rank == 3:
            checks += _assert_dims_equal([("query", query, 0), ("relative_embeddings", rel, 0)], "batch sizes")

    with tf.control_dependencies(checks):
        # tf.where on the inputs, not a product on the outputs: padded rows may hold NaN or Inf, and
        # must reach neither an output nor (through phi's derivative) a gradient.
        keep_q = q_mask[:, :, None] > 0
        keep = k_mask[:, :, None] > 0
        phi_q = tf.where(keep_q, elu_plus_one(tf.where(keep_q, tf.cast(query, tf.float32), 0.0)), 0.0)
        phi_k = tf.where(keep, elu_plus_one(tf.where(keep, tf.cast(key, tf.float32), 0.0)), 0.0)
        ones = tf.ones(tf.stack([batch, k_len, 1]), tf.float32)
        v = tf.where(keep, tf.concat([tf.cast(value, tf.float32), ones], axis=-1), 0.0)  # [..., dv | 1]

    chunk = _chunk_rows(chunk_size, query)
    if causal:
        total = _causal_kernel_term(phi_q, phi_k, v, chunk)
    else:
        state = tf.einsum("bjd,bje->bde", phi_k, v)
        total = tf.einsum("bid,bde->bie", phi_q, state)
    if rel is not None:
        phi_rel = elu_plus_one(tf.cast(rel, tf.float32))
        if phi_rel.shape.rank == 2:
            scores = tf.einsum("bid,rd->bir", phi_q, phi_rel)
        else:
            scores = tf.einsum("bid,brd->bir", phi_q, phi_rel)
        total += _relative_term(scores, v, horizon, causal, chunk)
    numerator, denominator = total[..., :-1], total[..., -1:]
    out = tf.where(keep_q, numerator / (denominator + epsilon), 0.0)
    return tf.cast(out, out_dtype)
