"""YOSO on a sequence split over devices: each device's own block through its provider, the other
blocks through their bucket tables (one collective per table).

With fixed hash functions, eq. 2 is linear attention with one-hot features: the keys of block s
reach every query only through the tables T_s[h, b] = sum_{j in s, kc_hj = b} V_j
(`[B, m, 2^tau, D]`, independent of the block length). So on device s

    out_i = own(i) + (1/m) sum_h R[h, qc_hi],   R = sum_{s' != s} T_s'   (bidirectional)
                                                R = sum_{s' < s} T_s'    (causal: keys j <= i)
                                                R = sum_{s' > s} T_s'    (anti-causal: j >= i)

where own(i) is the provider's cumulation of the local block (the native kernels where loaded).
R is one psum (psum(T) - T), or an exclusive scan over the devices (1 + ceil(log2 P) ppermutes). The eq. 4 backward is the
same with other tables: dV with the tables of dY (by query code), dQ_i = (tau/2)(1/m) sum_h
<dY_i, TVK_h[qc_hi]> with TVK the sums of V_j (x) K_j per bucket, dK_j = (tau/2)(1/m) sum_h
<V_j, TYQ_h[kc_hj]> with TYQ the sums of dY_i (x) Q_i: three collectives of
B m 2^tau Dv (1 + 2 dk) floats in all, independent of the sequence length.
"""

from keras import ops

from keras_yoso import _runtime
from keras_yoso.ops import _sharding
from keras_yoso.ops import composite

# Largest outer-product table of one collective in the backward, in floats (64 MiB of float32): hashes
# are reduced in groups that fit.
TABLE_FLOATS_PER_COLLECTIVE = 2 ** 24


def _table_rows(codes, mask, num_buckets):
    """Flat table row of each (row b, hash h, position n): (b m + h) (num_buckets + 1) + code, masked
    positions in the spare row num_buckets of their (b, h) (never read back)."""
    batch, num_hashes = ops.shape(codes)[0], codes.shape[1]
    ids = composite._bucket_ids(codes, mask, num_buckets, num_buckets)
    base = ops.reshape(ops.arange(batch * num_hashes, dtype="int32") * (num_buckets + 1), (batch, num_hashes, 1))
    return ids + base


def _remote(table, axis, size, causal):
    """The sum of the other devices' `table` that `causal` lets this device's queries see."""
    if causal == 0:
        return _sharding.psum(table, axis) - table
    return _sharding.exclusive_scan(table, axis, size, causal)


class SequenceShardedProvider:
    """A provider (`_provider.Provider`) for one device's block of a split sequence: `inner` (the
    provider chosen for the op) on the block, the other blocks through bucket tables reduced over
    the mesh axis `axis` of `size` devices. Codes and masks are the block's; queries and keys are
    at the same positions (self-attention layout)."""

    def __init__(self, inner, axis, size):
        self.inner, self.axis, self.size = inner, axis, size
        for name in ("name", "checks_codes", "needs_static_num_hashes", "max_bucket_table_floats", "supports_jit",
                     "deterministic"):
            setattr(self, name, getattr(inner, name))

    def _tables(self, codes, mask, vectors, num_buckets, causal):
        """R of the module docstring for `vectors` [B, n, F] scattered by `codes` [B, m, n]: float32
        [B * m * (num_buckets + 1), F] (the remote sums of each (row, hash, bucket))."""
        batch, num_hashes, width = ops.shape(codes)[0], codes.shape[1], ops.shape(vectors)[2]
        length = ops.shape(codes)[2]
        data = ops.reshape(ops.broadcast_to(composite._keep_rows(mask, composite._f32(vectors))[:, None],
                                            (batch, num_hashes, length, width)), (-1, width))
        table = _runtime.segment_sum(data, ops.reshape(_table_rows(codes, mask, num_buckets), (-1,)),
                                     batch * num_hashes * (num_buckets + 1))
        return _remote(table, self.axis, self.size, causal)

    def _read(self, table, codes, mask, num_buckets):
        """(1/m) sum_h table[row of (b, h, qc_hi)] for the queries `codes` [B, m, n]: [B, n, F], masked queries 0."""
        batch, num_hashes, length = ops.shape(codes)[0], codes.shape[1], ops.shape(codes)[2]
        rows = ops.take(table, ops.reshape(_table_rows(codes, mask, num_buckets), (-1,)), axis=0)
        out = ops.mean(ops.reshape(rows, (batch, num_hashes, length, -1)), axis=1)
        return composite._keep_rows(mask, out)

    def hash_codes(self, x, params, num_hashes, hash_code_len, method):
        return self.inner.hash_codes(x, params, num_hashes, hash_code_len, method)

    def lsh_cumulation(self, query_codes, key_codes, value, num_buckets, query_mask, key_mask, causal=0):
        own = self.inner.lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask, key_mask,
                                        causal=causal)
        remote = self._tables(key_codes, key_mask, value, num_buckets, causal)
        return composite._f32(own) + self._read(remote, query_codes, query_mask, num_buckets)

    def _outer_term(self, table_codes, table_mask, left, right, read_codes, read_mask, weight, num_buckets, causal):
        """(1/m) sum_h <weight_i, O_h[code_hi]> over the remote outer-product tables
        O_h[b] = sum_{j: code_hj = b} left_j (x) right_j: [B, n, E] for left [B, n, W], right [B, n, E],
        weight [B, n, W]; hashes reduced in groups of at most TABLE_FLOATS_PER_COLLECTIVE floats."""
        batch, num_hashes, length = ops.shape(table_codes)[0], table_codes.shape[1], ops.shape(table_codes)[2]
        left = composite._keep_rows(table_mask, composite._f32(left))
        right = composite._keep_rows(table_mask, composite._f32(right))
        width, depth = ops.shape(left)[2], ops.shape(right)[2]
        outer = ops.reshape(left[:, :, :, None] * right[:, :, None, :], (batch * length, width * depth))
        weight = composite._keep_rows(read_mask, composite._f32(weight))
        per_hash = batch * (num_buckets + 1) * width * depth
        group = max(1, min(num_hashes, TABLE_FLOATS_PER_COLLECTIVE // max(1, per_hash)))
        total = None
        for h0 in range(0, num_hashes, group):
            h1 = min(num_hashes, h0 + group)
            count = h1 - h0
            base = ops.reshape(ops.arange(batch * count, dtype="int32") * (num_buckets + 1), (batch, count, 1))
            write = composite._bucket_ids(table_codes[:, h0:h1], table_mask, num_buckets, num_buckets) + base
            data = ops.reshape(ops.broadcast_to(ops.reshape(outer, (batch, 1, length, width * depth)),
                                                (batch, count, length, width * depth)), (-1, width * depth))
            table = _runtime.segment_sum(data, ops.reshape(write, (-1,)), batch * count * (num_buckets + 1))
            table = _remote(table, self.axis, self.size, causal)
            read = composite._bucket_ids(read_codes[:, h0:h1], read_mask, num_buckets, num_buckets) + base
            rows = ops.reshape(ops.take(table, ops.reshape(read, (-1,)), axis=0), (batch, count, length, width, depth))
            part = ops.einsum("bnw,bhnwe->bne", weight, rows)
            total = part if total is None else total + part
        return composite._keep_rows(read_mask, total / num_hashes)

    def lower_bound_gradients(self, query_codes, query, key_codes, key, value, output_gradient, num_buckets,
                              scale, query_mask, key_mask, causal=0):
        dq, dk = self.inner.lower_bound_gradients(query_codes, query, key_codes, key, value, output_gradient,
                                                  num_buckets, scale, query_mask, key_mask, causal=causal)
        dq = composite._f32(dq) + scale * self._outer_term(key_codes, key_mask, value, key, query_codes, query_mask,
                                                           output_gradient, num_buckets, causal)
        dk = composite._f32(dk) + scale * self._outer_term(query_codes, query_mask, output_gradient, query, key_codes,
                                                           key_mask, value, num_buckets, -causal)
        return dq, dk

    def weighted_lsh_cumulation(self, *args, **kwargs):
        raise ValueError("weighted_lsh_cumulation has no sequence-parallel form here: call it outside "
                         "keras_yoso.distribution.SequenceParallel (YOSO's backward uses lower_bound_gradients).")

    def collision_cumulation(self, *args, **kwargs):
        raise ValueError("backward=\"collision\" (*YOSO) is not sequence-parallel: its pair weight depends on "
                         "<Q_i, K_j> itself, so it needs the colliding keys of every device, not bucket sums. "
                         "Use backward=\"lower_bound\" (paper eq. 4) under keras_yoso.distribution.SequenceParallel.")
