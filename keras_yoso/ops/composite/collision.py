"""YOSO-E weights and the *YOSO (collision) estimator."""

import math

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.chunking import COMPUTE_DTYPE
from keras_yoso.ops.composite.chunking import f32
from keras_yoso.ops.composite.chunking import has_zero_dim
from keras_yoso.ops.composite.chunking import known
from keras_yoso.ops.composite.masking import bucket_ids
from keras_yoso.ops.composite.masking import keep_rows
from keras_yoso.ops.composite.sorted_tiles import flat
from keras_yoso.ops.composite.sorted_tiles import for_hash_chunks
from keras_yoso.ops.composite.sorted_tiles import pair_sum
from keras_yoso.ops.composite.sorted_tiles import run_tiles
from keras_yoso.ops.composite.sorted_tiles import take_rows


def expectation_weights(query, key, hash_code_len):
    """(x, E) `[B, Nq, Nk]`: x = <Q_i, K_j> clipped to [-1, 1], E = (1 - acos(x)/pi)^tau (§3.1)."""
    x = ops.clip(ops.einsum("bid,bjd->bij", query, key), -1.0, 1.0)
    return x, ops.power(1.0 - ops.arccos(x) / math.pi, float(hash_code_len))


def collision_derivative(x, hash_code_len, epsilon):
    """tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)), x clipped to [-1, 1] (appendix eq. 2)."""
    x = ops.clip(x, -1.0, 1.0)
    p = 1.0 - ops.arccos(x) / math.pi
    tau = float(hash_code_len)
    return tau * ops.power(p, tau - 1.0) / (math.pi * ops.sqrt(1.0 - x * x + epsilon))


@_backend.compiled(static_argnames=("hash_code_len", "epsilon"))
def collision_cumulation(query_mask, query_codes, query, query_weight, key_mask, key_codes, key, key_weight,
                         hash_code_len, epsilon):
    """*YOSO estimator `[B, Nq, d]` float32: sum over pairs that collide in >= 1 hash, each once, of
    <query_weight_i, key_weight_j> g(<query_i, key_j>) key_j (appendix eq. 2 on colliding pairs).

    Sort-by-code tiles per hash; a pair is counted in the first hash where it collides (its codes
    in every earlier hash are compared in the tile).
    """
    num_buckets = 2 ** hash_code_len
    batch, num_queries = ops.shape(query_codes)[0], ops.shape(query_codes)[2]
    num_keys, dim = ops.shape(key_codes)[2], ops.shape(query)[2]
    weight_dim = ops.shape(query_weight)[2]
    if has_zero_dim(batch, num_queries, num_keys, dim, weight_dim):
        return ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE)
    q = keep_rows(query_mask, f32(query))
    k = keep_rows(key_mask, f32(key))
    query_table = flat(ops.concatenate([q, keep_rows(query_mask, f32(query_weight))], axis=-1))
    key_table = flat(ops.concatenate([k, keep_rows(key_mask, f32(key_weight))], axis=-1))
    value_table = flat(k)
    # Codes of every hash per position, [B * N, m], for the first-collision test.
    query_code_table = flat(ops.transpose(bucket_ids(query_codes, query_mask, num_buckets, num_buckets + 1),
                                           (0, 2, 1)))
    key_code_table = flat(ops.transpose(bucket_ids(key_codes, key_mask, num_buckets, num_buckets), (0, 2, 1)))
    outputs = [(batch * num_queries + 1, dim)]
    num_hashes = query_codes.shape[1]

    def step(h0, count, chunk, total):
        def pairs_of(t):
            shape = ops.shape(t["pairs"])
            queries, keys = (shape[0], shape[1]), (shape[0], shape[2])
            query_feats = take_rows(query_table, t["query_rows"], queries)
            key_feats = take_rows(key_table, t["key_rows"], keys)
            query_hash_codes = take_rows(query_code_table, t["query_rows"], queries)
            key_hash_codes = take_rows(key_code_table, t["key_rows"], keys)
            # Hash of each tile: its row is b * count + (h - h0).
            tile_hash = ops.reshape(t["tile_row"] % count + h0, (-1, 1, 1))
            earlier = None
            for h in range(num_hashes - 1):
                same = ops.equal(query_hash_codes[:, :, None, h], key_hash_codes[:, None, :, h])
                same = ops.logical_and(same, ops.less(h, tile_hash))
                earlier = same if earlier is None else ops.logical_or(earlier, same)
            first = t["pairs"] if earlier is None else ops.logical_and(t["pairs"], ops.logical_not(earlier))
            cosine = ops.matmul(query_feats[..., :dim], ops.transpose(key_feats[..., :dim], (0, 2, 1)))
            scale = ops.matmul(query_feats[..., dim:], ops.transpose(key_feats[..., dim:], (0, 2, 1)))
            weights = ops.where(first, scale * collision_derivative(cosine, hash_code_len, epsilon), 0.0)
            out = pair_sum(weights, first, take_rows(value_table, t["key_rows"], keys))
            return [(ops.reshape(out, (shape[0] * shape[1], dim)), t["query_slots"])]

        sums = run_tiles(chunk, pairs_of, outputs)[0]
        return total + ops.reshape(sums[:-1], (batch, num_queries, dim))

    widths = 2 * (dim + weight_dim) if known(dim, weight_dim) else None
    total = for_hash_chunks(query_codes, key_codes, query_mask, key_mask, num_buckets, widths, step,
                             ops.zeros((batch, num_queries, dim), COMPUTE_DTYPE))
    return keep_rows(query_mask, total)
