"""Scaleformer's attention in `keras.ops` (Favier & Dal'Maz Silva 2022, eq. 9-11, Algorithms 1-2):
the kernel term phi(Q) (phi(K)^T [V | 1]) (bidirectional state, or causal chunks of C rows with an
exclusive prefix sum of per-chunk states) and the relative term (prefix / suffix sums beyond the
horizon, a banded product inside it). The contract and costs: `keras_yoso.ops.linear_relative`."""

from keras import ops

from keras_yoso import _backend
from keras_yoso import _validation


def elu_plus_one(x):
    """phi(x) = elu(x) + 1 > 0, as `where(x > 0, x + 1, exp(min(x, 0)))` (no cancellation in bf16)."""
    return ops.where(ops.greater(x, 0), x + 1, ops.exp(ops.minimum(x, ops.zeros((), x.dtype))))


def pad_rows(x, length):
    """Zero rows appended to axis 1 of `x` [B, N, ...] up to `length` (>= N)."""
    shape = ops.shape(x)
    extra = ops.zeros((shape[0], length - shape[1]) + tuple(shape[2:]), x.dtype)
    return ops.concatenate([x, extra], axis=1)


def chunk_rows(chunk_size, q_len):
    """Rows per chunk: `chunk_size` (default 64) clamped to [1, Lq], so a large chunk_size never
    allocates more than one dense Lq x Lq block. A Python int when Lq is static, else a scalar tensor."""
    chunk = chunk_size or _validation.LINEAR_RELATIVE_CHUNK_SIZE
    if isinstance(q_len, int):
        return max(1, min(chunk, q_len))
    return ops.clip(q_len, 1, chunk)


def causal_kernel_term(q, k, v, chunk):
    """sum_{j <= i} <q_i, k_j> v_j in chunks of `chunk` rows: [B, Lq, d], [B, Lk, d], [B, Lk, e] -> [B, Lq, e].

    Keys past the last query are never attended, so keys are aligned to Lq first.
    """
    batch, q_len = ops.shape(q)[0], ops.shape(q)[1]
    d, e = q.shape[-1], v.shape[-1]
    k, v = k[:, :q_len], v[:, :q_len]
    num_chunks = (q_len + chunk - 1) // chunk
    padded = num_chunks * chunk
    qc = ops.reshape(pad_rows(q, padded), (batch, num_chunks, chunk, d))
    # When Lk < Lq the keys are shorter: pad them to the chunked query length too.
    kc = ops.reshape(pad_rows(k, padded), (batch, num_chunks, chunk, d))
    vc = ops.reshape(pad_rows(v, padded), (batch, num_chunks, chunk, e))
    rows = ops.arange(chunk)
    lower = ops.cast(ops.greater_equal(rows[:, None], rows[None, :]), "float32")
    scores = ops.einsum("bnid,bnjd->bnij", qc, kc) * lower
    intra = ops.einsum("bnij,bnje->bnie", scores, vc)
    states = ops.einsum("bnjd,bnje->bnde", kc, vc)                 # [B, L/C, d, e]
    before = _backend.exclusive_cumsum(states, axis=1)
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


def relative_term(w, v, horizon, causal, chunk, key_offset=0):
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
    w_flat = ops.reshape(pad_rows(w, padded), (batch, num_chunks, chunk * width))
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


def features(query, key, value, q_mask, k_mask):
    """phi(Q) [B, Lq, d], phi(K) [B, Lk, d] and [V | 1] [B, Lk, dv + 1] in float32, zero on padded rows."""
    # where on the inputs, not a product on the outputs: padded rows may hold NaN or Inf, and must
    # reach neither an output nor (through phi's derivative) a gradient.
    keep_q, keep = q_mask[:, :, None], k_mask[:, :, None]
    phi_q = ops.where(keep_q, elu_plus_one(ops.where(keep_q, ops.cast(query, "float32"), 0.0)), 0.0)
    phi_k = ops.where(keep, elu_plus_one(ops.where(keep, ops.cast(key, "float32"), 0.0)), 0.0)
    ones = ops.ones((ops.shape(value)[0], ops.shape(value)[1], 1), "float32")
    v = ops.where(keep, ops.concatenate([ops.cast(value, "float32"), ones], axis=-1), 0.0)  # [..., dv | 1]
    return phi_q, phi_k, v


def relative_scores(phi_q, rel):
    """W = phi(Q) phi(RP)^T (Algorithm 2): [B, Lq, d] and [2k+1, d] or [B, 2k+1, d] -> [B, Lq, 2k+1]."""
    phi_rel = elu_plus_one(ops.cast(rel, "float32"))
    if len(_backend.static_shape(phi_rel)) == 2:
        return ops.einsum("bid,rd->bir", phi_q, phi_rel)
    return ops.einsum("bid,brd->bir", phi_q, phi_rel)


def normalize(total, q_mask, epsilon):
    """eq. 10: numerator / (denominator + epsilon) from `total` [..., dv | denominator]; padded queries 0."""
    numerator, denominator = total[..., :-1], total[..., -1:]
    return ops.where(q_mask[:, :, None], numerator / (denominator + epsilon), 0.0)


def total_rows(phi_q, phi_k, v, scores, horizon, causal, chunk):
    """The numerator and denominator rows [B, Lq, dv + 1] of eq. 10: kernel term plus relative term."""
    if causal:
        total = causal_kernel_term(phi_q, phi_k, v, chunk)
    else:
        state = ops.einsum("bjd,bje->bde", phi_k, v)
        total = ops.einsum("bid,bde->bie", phi_q, state)
    if scores is not None:
        total = total + relative_term(scores, v, horizon, causal, chunk)
    return total
