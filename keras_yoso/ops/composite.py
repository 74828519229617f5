"""Pure-TensorFlow composites of every keras-yoso op.

Each function computes the same numbers as the custom op of the same name
(to float32 rounding), with ordinary TF ops only, so a graph built from them
runs anywhere TensorFlow runs: XLA (`jit_compile=True`), TPUs, TF Serving
without keras_yoso installed. Shapes and semantics are documented on the
public functions in `keras_yoso.ops`.

Costs: the hashing and cumulations are linear in sequence length
(O(B m (Nq + Nk) F) time, with F = D, or W*D for the weighted cumulation,
whose key-side outer products take O(B Nk W D) memory and whose bucket table
per hash is [B * num_buckets, W * D]; num_buckets * W * D is limited to
MAX_BUCKET_TABLE_FLOATS, like the custom op's). The collision estimator is dense
here (O(B Nq Nk) memory); use the custom op at long lengths.

Masks are float [B, N]; like the kernels, any nonzero value (NaN included) keeps
the position.
"""

import math

import tensorflow as tf

COMPUTE_DTYPE = tf.float32
# Largest bucket table of a weighted cumulation, num_buckets * W * D floats (1 GiB of float32);
# the kernels' kMaxBucketTableFloats (custom_ops/cc/kernels/yoso_common.h).
MAX_BUCKET_TABLE_FLOATS = 2 ** 28


def _static_dim(tensor, axis, what):
    dim = tensor.shape[axis]
    if dim is None:
        raise ValueError(f"{what} must be known when the graph is built for the composite path; "
                         f"got shape {tensor.shape}")
    return dim


def pack_sign_bits(projected, num_hashes, hash_code_len):
    """projected [B, N, >= m*tau] -> int32 codes [B, m, N]; bit i of hash h is projected[..., h*tau+i] > 0."""
    bits = tf.cast(projected[..., : num_hashes * hash_code_len] > 0, tf.int32)
    shape = tf.concat([tf.shape(bits)[:2], [num_hashes, hash_code_len]], 0)
    bits = tf.reshape(bits, shape)
    weights = tf.bitwise.left_shift(tf.ones([hash_code_len], tf.int32), tf.range(hash_code_len))
    return tf.transpose(tf.reduce_sum(bits * weights, -1), [0, 2, 1])


def gaussian_hash_codes(x, projection, num_hashes, hash_code_len):
    """Hyperplane LSH with a dense Gaussian projection [d, m*tau] (appendix §1.2)."""
    projected = tf.einsum("bnd,dk->bnk", tf.cast(x, COMPUTE_DTYPE), projection)
    return pack_sign_bits(projected, num_hashes, hash_code_len)


def fast_hadamard_transform(y):
    """Unnormalized Walsh-Hadamard transform (Sylvester order) over the last axis (a power of two).

    Same butterfly order as the C++ kernel, so both round identically.
    """
    size = _static_dim(y, -1, "the padded dimension")
    lead = tf.shape(y)[:-1]
    length = 1
    while length < size:
        z = tf.reshape(y, tf.concat([lead, [size // (2 * length), 2, length]], 0))
        a, b = z[..., 0, :], z[..., 1, :]
        y = tf.reshape(tf.stack([a + b, a - b], axis=-2), tf.concat([lead, [size]], 0))
        length *= 2
    return y


def hadamard_hash_codes(x, signs, num_hashes, hash_code_len):
    """Fast-Hadamard LSH: concat_q sign(H D3 H D2 H D1 pad(x)), signs [nb, 3, padded_dim] (appendix §1.2).

    The transform runs in float64, where the +-1 sums of float32 inputs are
    exact, so structural zeros give bit 0 here and in the kernels alike.
    """
    num_blocks = _static_dim(signs, 0, "the number of Hadamard blocks")
    padded_dim = _static_dim(signs, 2, "the padded dimension")
    dim = _static_dim(x, -1, "the last dimension of x")
    x = tf.cast(tf.cast(x, COMPUTE_DTYPE), tf.float64)
    y = tf.pad(x, [[0, 0], [0, 0], [0, padded_dim - dim]])
    y = tf.tile(y[:, :, None, :], [1, 1, num_blocks, 1])  # [B, N, nb, p]
    for stage in range(3):
        y = fast_hadamard_transform(y * tf.cast(signs[:, stage, :], tf.float64))
    projected = tf.reshape(y, tf.concat([tf.shape(x)[:2], [num_blocks * padded_dim]], 0))
    return pack_sign_bits(projected, num_hashes, hash_code_len)


def _keep(mask, data):
    """Zeroes data rows [B, N, F] whose mask [B, N] is 0 (NaN or Inf in those rows included)."""
    return tf.where(mask[:, :, None] != 0, data, tf.zeros_like(data))


def bucket_table_message(num_buckets, weight_dim, value_dim):
    """The error text of a bucket table over MAX_BUCKET_TABLE_FLOATS (the kernels' text)."""
    return (f"the bucket table of the weighted LSH cumulation, num_buckets * weight_dim * value_dim = "
            f"{num_buckets} * {weight_dim} * {value_dim} floats (weight_dim: axis 2 of query_weight and "
            f"key_weight; value_dim: axis 2 of value), exceeds the limit of 2**28 floats (1 GiB); use fewer "
            f"buckets or split weight_dim or value_dim into chunks")


def check_bucket_table(num_buckets, weight_dim, value_dim):
    """Raises ValueError when the known widths make num_buckets * W * D exceed MAX_BUCKET_TABLE_FLOATS."""
    if weight_dim is not None and value_dim is not None and (
            num_buckets * weight_dim * value_dim > MAX_BUCKET_TABLE_FLOATS):
        raise ValueError(bucket_table_message(num_buckets, weight_dim, value_dim))


def _bucket_table_assertions(num_buckets, weight, value):
    """check_bucket_table now, or a run-time assertion when weight [.., W] or value [.., D] has an unknown width."""
    check_bucket_table(num_buckets, weight.shape[-1], value.shape[-1])
    if weight.shape[-1] is not None and value.shape[-1] is not None:
        return []
    # float64: exact below 2**53, and any product that large is far over the limit anyway.
    floats = (float(num_buckets) * tf.cast(tf.shape(weight)[-1], tf.float64)
              * tf.cast(tf.shape(value)[-1], tf.float64))
    return [tf.debugging.assert_less_equal(floats, tf.constant(MAX_BUCKET_TABLE_FLOATS, tf.float64),
                                           message=bucket_table_message(
                                               num_buckets, "?" if weight.shape[-1] is None else weight.shape[-1],
                                               "?" if value.shape[-1] is None else value.shape[-1]))]


def _bucket_sum_and_gather(query_codes, key_codes, key_data, num_buckets):
    """For each hash: scatter key_data [B, Nk, F] by key code, gather by query code.

    Yields one [B, Nq, F] tensor per hash (codes [B, m, N]).
    """
    num_hashes = _static_dim(query_codes, 1, "num_hashes (axis 1 of query_codes)")
    batch, num_keys, feature = tf.unstack(tf.shape(key_data))
    offsets = tf.range(batch)[:, None] * num_buckets
    # Explicit sizes: reshaping an empty tensor to [-1, 0] would infer 1 row, not B * Nk.
    flat_data = tf.reshape(key_data, tf.stack([batch * num_keys, feature]))
    for h in range(num_hashes):
        key_ids = tf.reshape(key_codes[:, h, :] + offsets, [-1])
        table = tf.math.unsorted_segment_sum(flat_data, key_ids, batch * num_buckets)
        yield tf.gather(table, query_codes[:, h, :] + offsets)


def lsh_cumulation(query_mask, query_codes, key_mask, key_codes, value, num_buckets):
    """YOSO eq. 2 averaged over hashes; masks are float [B, N] of 0/1."""
    dtype = value.dtype
    num_hashes = _static_dim(query_codes, 1, "num_hashes (axis 1 of query_codes)")
    data = _keep(key_mask, tf.cast(value, COMPUTE_DTYPE))
    total = tf.add_n(list(_bucket_sum_and_gather(query_codes, key_codes, data, num_buckets)))
    return tf.cast(_keep(query_mask, total / num_hashes), dtype)


def weighted_lsh_cumulation(query_mask, query_codes, query_weight, key_mask, key_codes, key_weight,
                            value, num_buckets):
    """lsh_cumulation with pair (i, j) weighted by <query_weight_i, key_weight_j>."""
    dtype = value.dtype
    num_hashes = _static_dim(query_codes, 1, "num_hashes (axis 1 of query_codes)")
    with tf.control_dependencies(_bucket_table_assertions(num_buckets, query_weight, value)):
        key_weight = tf.identity(key_weight)
    kw = _keep(key_mask, tf.cast(key_weight, COMPUTE_DTYPE))
    v = _keep(key_mask, tf.cast(value, COMPUTE_DTYPE))
    qw = _keep(query_mask, tf.cast(query_weight, COMPUTE_DTYPE))
    width, value_dim = tf.shape(kw)[2], tf.shape(v)[2]
    outer = tf.reshape(kw[:, :, :, None] * v[:, :, None, :], tf.concat([tf.shape(v)[:2], [width * value_dim]], 0))
    total = None
    for gathered in _bucket_sum_and_gather(query_codes, key_codes, outer, num_buckets):
        gathered = tf.reshape(gathered, tf.concat([tf.shape(qw)[:2], [width, value_dim]], 0))
        term = tf.einsum("bqw,bqwd->bqd", qw, gathered)
        total = term if total is None else total + term
    return tf.cast(_keep(query_mask, total / num_hashes), dtype)


def expectation_weights(query, key, hash_code_len, pair_mask):
    """YOSO-E weights E_ij = (1 - acos(x_ij)/pi)^tau * pair_mask_ij, x = <Q_i, K_j> clipped to [-1, 1] (§3.1).

    query [B, Nq, d], key [B, Nk, d] (float32), pair_mask [B, Nq, Nk] of 0/1.
    Returns (x, E), both [B, Nq, Nk]: the backward of YOSO-E needs the cosines too.
    """
    x = tf.clip_by_value(tf.einsum("bid,bjd->bij", query, key), -1.0, 1.0)
    return x, tf.pow(1.0 - tf.acos(x) / math.pi, float(hash_code_len)) * pair_mask


def collision_derivative(x, hash_code_len, epsilon):
    """tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)), x clipped to [-1, 1] (appendix eq. 2)."""
    x = tf.clip_by_value(x, -1.0, 1.0)
    p = 1.0 - tf.acos(x) / math.pi
    return hash_code_len * tf.pow(p, hash_code_len - 1.0) / (math.pi * tf.sqrt(1.0 - x * x + epsilon))


def _colliding_sum(w, key, collide):
    """sum_j w_ij key_j over the colliding pairs only: w, collide [B, Nq, Nk], key [B, Nk, d].

    w is 0 off the colliding pairs, but a dense product would still spread a non-finite key_j
    to every query (0 * NaN = NaN). So the finite part of key goes through the product and its
    non-finite entries are added back from counts over colliding pairs: +Inf, -Inf and NaN
    terms, as the kernels' sequential sums produce them (NaN when +Inf meets -Inf, 0 * Inf = NaN).
    """
    finite = tf.math.is_finite(key)
    total = tf.einsum("bij,bjd->bid", w, tf.where(finite, key, tf.zeros_like(key)))

    def with_nonfinite_keys():
        pair = tf.cast(collide, w.dtype)
        positive, negative = pair * tf.cast(w > 0, w.dtype), pair * tf.cast(w < 0, w.dtype)
        zero = pair * tf.cast(tf.equal(w, 0.0), w.dtype)
        plus_inf = tf.cast(tf.equal(key, math.inf), w.dtype)
        minus_inf = tf.cast(tf.equal(key, -math.inf), w.dtype)
        count = lambda a, b: tf.einsum("bij,bjd->bid", a, b)  # noqa: E731
        plus = count(positive, plus_inf) + count(negative, minus_inf)
        minus = count(negative, plus_inf) + count(positive, minus_inf)
        nan = count(pair, tf.cast(tf.math.is_nan(key), w.dtype)) + count(zero, plus_inf + minus_inf)
        zeros = tf.zeros_like(total)
        return (total + tf.where(plus > 0, zeros + math.inf, zeros) - tf.where(minus > 0, zeros + math.inf, zeros)
                + tf.where(nan > 0, zeros + math.nan, zeros))

    return tf.cond(tf.reduce_all(finite), lambda: total, with_nonfinite_keys)


def collision_cumulation(query_mask, query_codes, query, query_weight, key_mask, key_codes, key,
                         key_weight, hash_code_len, epsilon):
    """*YOSO estimator: sum over keys colliding in >= 1 hash of <qw_i, kw_j> g(<q_i, k_j>) k_j (dense)."""
    dtype = query.dtype
    num_hashes = _static_dim(query_codes, 1, "num_hashes (axis 1 of query_codes)")
    collide = None
    for h in range(num_hashes):
        same = tf.equal(query_codes[:, h, :, None], key_codes[:, h, None, :])
        collide = same if collide is None else tf.logical_or(collide, same)
    collide = tf.logical_and(collide, tf.logical_and(query_mask[:, :, None] != 0, key_mask[:, None, :] != 0))
    q = tf.cast(query, COMPUTE_DTYPE)
    k = _keep(key_mask, tf.cast(key, COMPUTE_DTYPE))
    g = tf.einsum("biv,bjv->bij", tf.cast(query_weight, COMPUTE_DTYPE),
                  _keep(key_mask, tf.cast(key_weight, COMPUTE_DTYPE)))
    w = g * collision_derivative(tf.einsum("bid,bjd->bij", q, k), float(hash_code_len), epsilon)
    w = tf.where(collide, w, tf.zeros_like(w))
    return tf.cast(_colliding_sum(w, k, collide), dtype)
