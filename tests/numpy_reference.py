"""Dense NumPy references of every keras-yoso op, written directly from the formulas.

Used by the CPU test suite and by the standalone GPU harness (tests/gpu/), so it
imports nothing but NumPy. All math is float64; shapes follow `keras_yoso.ops`.
"""

import numpy as np


def _mask(mask, batch, length):
    if mask is None:
        return np.ones((batch, length), dtype=np.float64)
    return (np.asarray(mask) != 0).astype(np.float64)


def _pack_bits(bits, num_hashes, hash_code_len):
    """bits [B, N, >= m*tau] bool -> codes int32 [B, m, N], bit i of hash h is bits[..., h*tau+i]."""
    batch, length = bits.shape[:2]
    bits = bits[..., : num_hashes * hash_code_len].reshape(batch, length, num_hashes, hash_code_len)
    weights = (1 << np.arange(hash_code_len, dtype=np.int64))
    codes = (bits.astype(np.int64) * weights).sum(-1)
    return np.transpose(codes, (0, 2, 1)).astype(np.int32)


def gaussian_hash_codes(x, projection, num_hashes, hash_code_len):
    """Sign random projections, appendix §1.2: F(x) = sign(P x) -> int32 [B, m, N]."""
    proj = np.einsum("bnd,dk->bnk", np.asarray(x, np.float64), np.asarray(projection, np.float64))
    return _pack_bits(proj > 0, num_hashes, hash_code_len)


def hadamard_matrix(size):
    """Unnormalized Sylvester Hadamard matrix of a power-of-two size."""
    h = np.ones((1, 1))
    while h.shape[0] < size:
        h = np.block([[h, h], [h, -h]])
    return h


def hadamard_hash_codes(x, signs, num_hashes, hash_code_len, interleaved=False):
    """Fast-Hadamard LSH, appendix §1.2: concat_q sign(H D3 H D2 H D1 x) -> int32 [B, m, N].

    signs: [num_blocks, 3, padded_dim] of +-1; x is zero-padded to padded_dim. Bit k of the codes is
    row k of the concatenation, or (interleaved) row k // num_blocks of block k % num_blocks.
    """
    x = np.asarray(x, np.float64)
    signs = np.asarray(signs, np.float64)
    num_blocks, _, padded_dim = signs.shape
    h = hadamard_matrix(padded_dim)
    y = np.zeros(x.shape[:2] + (padded_dim,))
    y[..., : x.shape[-1]] = x
    blocks = []
    for q in range(num_blocks):
        z = y
        for p in range(3):
            z = (z * signs[q, p]) @ h.T
        blocks.append(z)
    rows = np.stack(blocks, -1) if interleaved else np.concatenate(blocks, -1)  # [B, N, p, blocks]: row r blocks + q
    return _pack_bits(rows.reshape(x.shape[:2] + (num_blocks * padded_dim,)) > 0, num_hashes, hash_code_len)


def hash_codes(x, params, num_hashes, hash_code_len, method):
    """The codes of `keras_yoso.ops.hash_codes(x, ..., method)` from its `hash_parameters`."""
    if method == "gaussian":
        return gaussian_hash_codes(x, params, num_hashes, hash_code_len)
    return hadamard_hash_codes(x, params, num_hashes, hash_code_len, interleaved=method == "hadamard_interleaved")


def hadamard_projection_matrix(signs, dim, interleaved=False):
    """[dim, num_blocks * padded_dim]: column q p + r (interleaved: r num_blocks + q) is row r of
    H D3 H D2 H D1 of block q (its first dim columns), so x @ matrix is the block transforms of x
    zero-padded to p."""
    signs = np.asarray(signs, np.float64)
    num_blocks, _, padded_dim = signs.shape
    h = hadamard_matrix(padded_dim)
    blocks = [h @ np.diag(signs[q, 2]) @ h @ np.diag(signs[q, 1]) @ h @ np.diag(signs[q, 0]) for q in range(num_blocks)]
    if interleaved:
        return np.stack([block[:, :dim].T for block in blocks], axis=2).reshape(dim, -1)
    return np.concatenate([block[:, :dim].T for block in blocks], axis=1)


def collision_counts(query_codes, key_codes):
    """c[b, i, j] = number of hashes where query i and key j share a code."""
    qc = np.asarray(query_codes)
    kc = np.asarray(key_codes)
    return (qc[:, :, :, None] == kc[:, :, None, :]).sum(1).astype(np.float64)


def direction_mask(nq, nk, causal):
    """[Nq, Nk] float: 1 where key j may count for query i. causal=0: every pair; 1 (causal): j <= i;
    -1 (anti-causal, the transposed cumulations of a causal backward): j >= i."""
    i, j = np.arange(nq)[:, None], np.arange(nk)[None, :]
    if causal == 0:
        return np.ones((nq, nk))
    return ((j <= i) if causal > 0 else (j >= i)).astype(np.float64)


def lsh_cumulation(query_codes, key_codes, value, query_mask=None, key_mask=None, causal=0):
    """out[b,i] = qmask (1/m) sum_h sum_j kmask [qc == kc] value[b, j] (YOSO eq. 2), over j <= i when
    causal=1 and j >= i when causal=-1."""
    value = np.asarray(value, np.float64)
    batch, num_hashes, nq = np.shape(query_codes)
    nk = np.shape(key_codes)[2]
    qm, km = _mask(query_mask, batch, nq), _mask(key_mask, batch, nk)
    c = collision_counts(query_codes, key_codes) * qm[:, :, None] * km[:, None, :] * direction_mask(nq, nk, causal)
    value = np.where(km[:, :, None] > 0, value, 0.0)
    return np.einsum("bij,bjd->bid", c, value) / num_hashes


def lsh_cumulation_step(query_mask, query_codes, key_mask, key_codes, value, tables):
    """The decoding step (custom_ops/triton/decoding.py): float64 (out [B, T, D], tables_out [B, m, num_buckets,
    D]) for T new positions over bucket tables [B, m, num_buckets, D]. Per (b, h), in position order t: key t's
    value joins bucket key_codes[b, h, t] where key_mask[b, t] != 0, then query t reads bucket query_codes[b, h, t]
    (1/m of the sum over h where query_mask[b, t] != 0; 0 elsewhere), so out is the old tables read by code plus
    eq. 2 over the chunk's keys s <= t. Rows a mask drops are never read (they may hold NaN)."""
    batch, num_hashes, length = np.shape(query_codes)
    query_mask, key_mask, value = np.asarray(query_mask), np.asarray(key_mask), np.asarray(value, np.float64)
    tables = np.array(tables, np.float64)
    out = np.zeros((batch, length, tables.shape[3]))
    b, h = np.meshgrid(np.arange(batch), np.arange(num_hashes), indexing="ij")  # [B, m]
    for t in range(length):
        keep = key_mask[:, t] != 0
        tables[b[keep], h[keep], np.asarray(key_codes)[keep, :, t]] += value[keep, t][:, None, :]
        read = query_mask[:, t] != 0
        out[read, t] = tables[b[read], h[read], np.asarray(query_codes)[read, :, t]].sum(axis=1) / num_hashes
    return out, tables


def weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value,
                            query_mask=None, key_mask=None, causal=0):
    """lsh_cumulation with pair (i, j) weighted by <query_weight[b,i], key_weight[b,j]> (causal as
    in lsh_cumulation)."""
    value = np.asarray(value, np.float64)
    batch, num_hashes, nq = np.shape(query_codes)
    nk = np.shape(key_codes)[2]
    qm, km = _mask(query_mask, batch, nq), _mask(key_mask, batch, nk)
    qw = np.where(qm[:, :, None] > 0, np.asarray(query_weight, np.float64), 0.0)
    kw = np.where(km[:, :, None] > 0, np.asarray(key_weight, np.float64), 0.0)
    value = np.where(km[:, :, None] > 0, value, 0.0)
    c = collision_counts(query_codes, key_codes) * qm[:, :, None] * km[:, None, :] * direction_mask(nq, nk, causal)
    pair = c * np.einsum("biw,bjw->bij", qw, kw)
    return np.einsum("bij,bjd->bid", pair, value) / num_hashes


def collision_derivative(x, hash_code_len, epsilon):
    """tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)), x clipped to [-1, 1]."""
    x = np.clip(x, -1.0, 1.0)
    p = 1.0 - np.arccos(x) / np.pi
    return hash_code_len * p ** (hash_code_len - 1) / (np.pi * np.sqrt(1.0 - x * x + epsilon))


def collision_cumulation(query_codes, query, query_weight, key_codes, key, key_weight,
                         hash_code_len, epsilon, query_mask=None, key_mask=None):
    """*YOSO estimator (appendix eq. 2 on colliding pairs): sum_j w_ij key[b, j] -> [B, Nq, d].

    w_ij = <query_weight_i, key_weight_j> * collision_derivative(<query_i, key_j>) over pairs
    that collide in at least one hash, each pair once.
    """
    query = np.asarray(query, np.float64)
    key = np.asarray(key, np.float64)
    batch, _, nq = np.shape(query_codes)
    nk = np.shape(key_codes)[2]
    qm, km = _mask(query_mask, batch, nq), _mask(key_mask, batch, nk)
    collide = (collision_counts(query_codes, key_codes) > 0) * qm[:, :, None] * km[:, None, :]
    key = np.where(km[:, :, None] > 0, key, 0.0)
    kw = np.where(km[:, :, None] > 0, np.asarray(key_weight, np.float64), 0.0)
    qw = np.where(qm[:, :, None] > 0, np.asarray(query_weight, np.float64), 0.0)
    x = np.einsum("bid,bjd->bij", np.where(qm[:, :, None] > 0, query, 0.0), key)
    w = np.einsum("biv,bjv->bij", qw, kw) * collision_derivative(x, hash_code_len, epsilon)
    return np.einsum("bij,bjd->bid", np.where(collide > 0, w, 0.0), key)


def expectation_matrix(query, key, hash_code_len):
    """YOSO-E weights E_ij = (1 - acos(<Q_i, K_j>)/pi)^tau, cosine clipped to [-1, 1]."""
    x = np.clip(np.einsum("bid,bjd->bij", np.asarray(query, np.float64),
                          np.asarray(key, np.float64)), -1.0, 1.0)
    return (1.0 - np.arccos(x) / np.pi) ** hash_code_len


def yoso_expectation(query, key, value, hash_code_len, query_mask=None, key_mask=None):
    """YOSO-E output E V with masked keys dropped and masked queries zero."""
    batch, nq = np.shape(query)[:2]
    nk = np.shape(key)[1]
    qm, km = _mask(query_mask, batch, nq), _mask(key_mask, batch, nk)
    e = expectation_matrix(query, key, hash_code_len) * qm[:, :, None] * km[:, None, :]
    value = np.where(km[:, :, None] > 0, np.asarray(value, np.float64), 0.0)
    return np.einsum("bij,bjd->bid", e, value)


def yoso_lower_bound_gradients(query, key, value, query_codes, key_codes, hash_code_len,
                               grad_output, query_mask=None, key_mask=None, causal=0):
    """Paper eq. 4 with the sampled counts c_ij: returns (dQ, dK, dV). causal 1 (or True): pairs j <= i only
    (dQ_i over j <= i; dK_j and dV_j over i >= j); -1: pairs j >= i (the mirror)."""
    num_hashes = np.shape(query_codes)[1]
    batch, nq = np.shape(query)[:2]
    nk = np.shape(key)[1]
    qm, km = _mask(query_mask, batch, nq), _mask(key_mask, batch, nk)
    c = collision_counts(query_codes, key_codes) * qm[:, :, None] * km[:, None, :] / num_hashes
    c = c * direction_mask(nq, nk, int(causal))
    dy = np.asarray(grad_output, np.float64) * qm[:, :, None]
    q = np.asarray(query, np.float64)
    k = np.asarray(key, np.float64)
    v = np.where(km[:, :, None] > 0, np.asarray(value, np.float64), 0.0)
    g = c * np.einsum("bid,bjd->bij", dy, v) * hash_code_len / 2.0
    return (np.einsum("bij,bjd->bid", g, k), np.einsum("bij,bid->bjd", g, q),
            np.einsum("bij,bid->bjd", c, dy))


def yoso_collision_gradients(query, key, value, query_codes, key_codes, hash_code_len,
                             grad_output, epsilon, query_mask=None, key_mask=None):
    """*YOSO estimator (appendix eq. 2 restricted to colliding pairs): returns (dQ, dK, dV)."""
    dq = collision_cumulation(query_codes, query, grad_output, key_codes, key, value,
                              hash_code_len, epsilon, query_mask, key_mask)
    dk = collision_cumulation(key_codes, key, value, query_codes, query, grad_output,
                              hash_code_len, epsilon, key_mask, query_mask)
    dv = lsh_cumulation(key_codes, query_codes, grad_output, key_mask, query_mask)
    return dq, dk, dv


def elu_plus_one(x):
    """phi(x) = elu(x) + 1 (Scaleformer §V)."""
    x = np.asarray(x, np.float64)
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _linear_relative_scores(query, key, relative_embeddings, horizon, causal, key_mask):
    """Dense [B, Lq, Lk] scores S_ij of Scaleformer eq. 9/11 with the masks applied, and their parts."""
    phi_q, phi_k = elu_plus_one(query), elu_plus_one(key)
    batch, q_len, k_len = query.shape[0], query.shape[1], key.shape[1]
    scores = np.einsum("bid,bjd->bij", phi_q, phi_k)
    rows = None
    phi_rel = None
    if horizon is not None:
        phi_rel = elu_plus_one(relative_embeddings)
        if phi_rel.ndim == 2:
            phi_rel = np.broadcast_to(phi_rel, (batch,) + phi_rel.shape)
        rows = np.clip(np.arange(k_len)[None, :] - np.arange(q_len)[:, None], -horizon, horizon) + horizon
        rel_all = np.einsum("bid,brd->bir", phi_q, phi_rel)  # [B, Lq, 2k+1]
        scores = scores + np.take_along_axis(rel_all, np.broadcast_to(rows, (batch, q_len, k_len)), axis=2)
    allowed = np.broadcast_to(_mask(key_mask, batch, k_len)[:, None, :], (batch, q_len, k_len)).copy()
    if causal:
        allowed *= np.tril(np.ones((q_len, k_len)))
    return scores * allowed, allowed, phi_q, phi_k, phi_rel, rows


def linear_relative_attention(query, key, value, relative_embeddings=None, horizon=None, causal=False,
                              query_mask=None, key_mask=None, epsilon=1e-6):
    """Scaleformer eq. 10, densely: out_i = sum_j S_ij V_j / (sum_j S_ij + eps), padded queries 0."""
    query, key, value = (np.asarray(t, np.float64) for t in (query, key, value))
    scores = _linear_relative_scores(query, key, relative_embeddings, horizon, causal, key_mask)[0]
    q_mask = _mask(query_mask, query.shape[0], query.shape[1])
    out = np.einsum("bij,bje->bie", scores, value) / (scores.sum(-1, keepdims=True) + epsilon)
    return out * q_mask[:, :, None]


def linear_relative_attention_gradients(query, key, value, out_grad, relative_embeddings=None, horizon=None,
                                        causal=False, query_mask=None, key_mask=None, epsilon=1e-6):
    """Analytic gradients of sum(out * out_grad) for `linear_relative_attention`.

    Returns (d_query, d_key, d_value, d_relative_embeddings or None); d_relative_embeddings
    has the shape of relative_embeddings (summed over the batch when it is shared).
    """
    query, key, value, out_grad = (np.asarray(t, np.float64) for t in (query, key, value, out_grad))
    scores, allowed, phi_q, phi_k, phi_rel, rows = _linear_relative_scores(
        query, key, relative_embeddings, horizon, causal, key_mask)
    q_mask = _mask(query_mask, query.shape[0], query.shape[1])[:, :, None]
    numerator = np.einsum("bij,bje->bie", scores, value)
    denominator = scores.sum(-1, keepdims=True) + epsilon
    d_numerator = q_mask * out_grad / denominator
    d_denominator = -q_mask * (out_grad * numerator).sum(-1, keepdims=True) / denominator ** 2
    d_scores = allowed * (np.einsum("bie,bje->bij", d_numerator, value) + d_denominator)
    d_value = np.einsum("bij,bie->bje", scores, d_numerator)
    d_phi_q = np.einsum("bij,bjd->bid", d_scores, phi_k)
    d_phi_k = np.einsum("bij,bid->bjd", d_scores, phi_q)
    d_rel = None
    if horizon is not None:
        onehot = np.eye(2 * horizon + 1)[rows]  # [Lq, Lk, 2k+1]
        d_rel_scores = np.einsum("bij,ijr->bir", d_scores, onehot)
        d_phi_q += np.einsum("bir,brd->bid", d_rel_scores, phi_rel)
        d_phi_rel = np.einsum("bir,bid->brd", d_rel_scores, phi_q)
        rel = np.asarray(relative_embeddings, np.float64)
        if rel.ndim == 2:
            d_phi_rel = d_phi_rel.sum(0)
        d_rel = d_phi_rel * np.where(rel > 0, 1.0, np.exp(np.minimum(rel, 0.0)))
    d_query = d_phi_q * np.where(query > 0, 1.0, np.exp(np.minimum(query, 0.0)))
    d_key = d_phi_k * np.where(key > 0, 1.0, np.exp(np.minimum(key, 0.0)))
    return d_query, d_key, d_value, d_rel


def local_attention(query, key, value, window, query_mask=None, key_mask=None, causal=False, key_offset=0):
    """Softmax attention over the keys j with |key_offset + i - j| < window (and j <= key_offset + i when causal),
    of the unmasked keys; 0 for a query with none and for masked queries. float64 [B, T, e]."""
    q, k, v = (np.asarray(t, np.float64) for t in (query, key, value))
    batch, length, dim = q.shape
    qm, km = _mask(query_mask, batch, length), _mask(key_mask, batch, k.shape[1])
    position = key_offset + np.arange(length)[:, None]
    keys = np.arange(k.shape[1])[None, :]
    allowed = np.abs(position - keys) < window
    if causal:
        allowed &= keys <= position
    out = np.zeros((batch, length, v.shape[-1]))
    for b in range(batch):
        scores = q[b] @ k[b].T / np.sqrt(dim)
        ok = allowed & (km[b][None, :] > 0)
        scores = np.where(ok, scores, -np.inf)
        top = np.max(scores, axis=1, keepdims=True)
        weights = np.where(ok, np.exp(scores - np.where(np.isfinite(top), top, 0.0)), 0.0)
        total = weights.sum(axis=1, keepdims=True)
        out[b] = np.where(total > 0, weights / np.where(total > 0, total, 1.0), 0.0) @ v[b]
    return out * qm[:, :, None]
