"""YOSO on a sequence split over devices: each device's own block through its provider, the other
blocks through their bucket tables (one collective per table).

With fixed hash functions, eq. 2 is linear attention with one-hot features: the keys of block s
reach every query only through the tables T_s[h, b] = sum_{j in s, kc_hj = b} V_j
(`[B, m, 2^tau, D]`, independent of the block length). So on device s

    out_i = own(i) + (1/m) sum_h R[h, qc_hi],   R = sum_{s' != s} T_s'   (bidirectional)
                                                R = sum_{s' < s} T_s'    (causal: keys j <= i)
                                                R = sum_{s' > s} T_s'    (anti-causal: j >= i)

where own(i) is the provider's cumulation of the local block (the native kernels where loaded).
R is one psum (psum(T) - T), or an exclusive scan over the devices (1 + ceil(log2(P - 1))
ppermutes, `mesh.exclusive_scan`). The eq. 4 backward is the same with other tables: dV
with the tables of dY (by query code), dQ_i = (tau/2)(1/m) sum_h <dY_i, TVK_h[qc_hi]> with TVK
the sums of V_j (x) K_j per bucket, dK_j = (tau/2)(1/m) sum_h <V_j, TYQ_h[kc_hj]> with TYQ the
sums of dY_i (x) Q_i: three collectives of B m 2^tau Dv (1 + 2 dk) floats in all, independent of
the sequence length (the outer-product tables go in groups of hashes of at most
TABLE_FLOATS_PER_COLLECTIVE floats, one collective each). Positions are scattered into the tables
and read back in chunks (CHUNK_FLOATS), so a device's memory is its block's activations plus the
tables: nothing of size n x m x D or n x Dv x dk.
"""

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops import _spec
from keras_yoso.ops.parallel import mesh
from keras_yoso.ops.composite.chunking import f32
from keras_yoso.ops.composite.masking import bucket_ids
from keras_yoso.ops.composite.masking import keep_rows

# Largest table of one collective, in floats (64 MiB of float32): the outer-product tables of the
# backward are reduced in groups of hashes that fit.
TABLE_FLOATS_PER_COLLECTIVE = 2 ** 24
# Largest per-position temporary of one step, in floats (4 MiB of float32): positions are scattered
# into the tables and read back in chunks that fit, so memory stays O(tables + block), not
# O(block x hashes x table width).
CHUNK_FLOATS = 2 ** 20


def _remote(table, axis, size, causal):
    """The sum of the other devices' `table` that the direction `causal` lets this device's queries see."""
    if causal == _spec.BIDIRECTIONAL:
        return mesh.psum(table, axis) - table
    return mesh.exclusive_scan(table, axis, size, causal)


class _Chunks:
    """Positions 0 .. n-1 of one device's block in chunks of `size` rows (the last padded)."""

    def __init__(self, length, floats_per_row):
        self.size = max(1, min(length, CHUNK_FLOATS // max(1, floats_per_row)))
        self.count = -(-length // self.size)
        self.padded = self.count * self.size

    def pad(self, x, axis):
        """`x` padded with zeros (False) along `axis` to the chunked length."""
        extra = self.padded - x.shape[axis]
        if extra == 0:
            return x
        widths = [(0, 0)] * len(x.shape)
        widths[axis] = (0, extra)
        return ops.pad(x, widths)

    def table_rows(self, codes, mask, num_buckets):
        """int32 [B, g, padded]: the flat table row (b g + h) (num_buckets + 1) + code of each (row b,
        hash h of the group, position); masked and padding positions go to the spare row num_buckets of
        their (b, h), which is never read back."""
        batch, group = ops.shape(codes)[0], codes.shape[1]
        ids = bucket_ids(self.pad(codes, 2), self.pad(mask, 1), num_buckets, num_buckets)
        offsets = ops.reshape(ops.arange(batch * group, dtype="int32") * (num_buckets + 1), (batch, group, 1))
        return ids + offsets

    def at(self, x, index, axis=1):
        """Chunk `index` of `x` (padded) along `axis`."""
        start = [0] * len(x.shape)
        start[axis] = index * self.size
        shape = list(ops.shape(x))
        shape[axis] = self.size
        return ops.slice(x, start, shape)


def lsh_remote(axis, size, query_mask, query_codes, key_mask, key_codes, value, num_buckets, causal):
    """The other devices' keys of lsh_cumulation for this device's queries, `[B, Nq, D]` float32."""
    width = value.shape[-1]
    return remote_term(axis, size, (key_codes, key_mask, [value]), (query_codes, query_mask, []), lambda v: v,
                       lambda rows: ops.sum(rows, axis=1), width, width, num_buckets, causal)


def lower_bound_remote(axis, size, query_mask, query_codes, query, key_mask, key_codes, key, value,
                       output_gradient, num_buckets, scale, causal=_spec.BIDIRECTIONAL):
    """The other devices' pairs of the eq. 4 gradients (dQ [B, Nq, d], dK [B, Nk, d]) float32, through the
    outer-product tables of V (x) K and dY (x) Q."""
    dq = _outer_term(axis, size, key_codes, key_mask, value, key, query_codes, query_mask, output_gradient,
                     num_buckets, causal)
    dk = _outer_term(axis, size, query_codes, query_mask, output_gradient, query, key_codes, key_mask, value,
                     num_buckets, _spec.transposed_direction(causal))
    return scale * dq, scale * dk


def remote_term(axis, size, write, reads, make_rows, combine, width, out_width, num_buckets, causal):
    """(1/m) sum_h combine(R_h rows at the read codes, *read tensors) `[B, n, out_width]` float32.

    write = (codes [B, m, n], mask [B, n], tensors [B, n, *]): R_h[b] = the other devices' sum over
    positions j with code_hj = b of make_rows(*tensors at j) (`width` floats); reads = (codes,
    mask, tensors): combine(rows [B, g, chunk, width], *tensors of the chunk) -> [B, chunk,
    out_width]; masked reads give 0. Hashes go in groups whose tables hold at most
    TABLE_FLOATS_PER_COLLECTIVE floats (one collective per group), positions in chunks of at most
    CHUNK_FLOATS per-position floats, so nothing of size n x m x width is ever formed.
    """
    write_codes, write_mask, write_tensors = write
    read_codes, read_mask, read_tensors = reads
    batch, num_hashes = ops.shape(write_codes)[0], write_codes.shape[1]
    group = max(1, min(num_hashes, TABLE_FLOATS_PER_COLLECTIVE // max(1, batch * (num_buckets + 1) * width)))
    # Keys and queries may differ in length (cross-attention): each side has its own chunks.
    writes = _Chunks(ops.shape(write_codes)[2], batch * group * width)
    reads_at = _Chunks(ops.shape(read_codes)[2], batch * group * max(width, out_width))
    write_tensors = [writes.pad(keep_rows(write_mask, f32(t)), 1) for t in write_tensors]
    read_tensors = [reads_at.pad(keep_rows(read_mask, f32(t)), 1) for t in read_tensors]
    num_rows = lambda count: batch * count * (num_buckets + 1)  # noqa: E731

    def scatter(ids):
        def add(index, table):
            values = make_rows(*(writes.at(t, index) for t in write_tensors))         # [B, chunk, width]
            block = writes.at(ids, index, 2)                                          # [B, g, chunk]
            data = ops.broadcast_to(values[:, None], (batch, block.shape[1], writes.size, width))
            return table + _backend.segment_sum(ops.reshape(data, (-1, width)), ops.reshape(block, (-1,)),
                                                num_rows(block.shape[1]))

        return ops.fori_loop(0, writes.count, add, ops.zeros((num_rows(ids.shape[1]), width), "float32"))

    def gather(table, ids, total):
        def read(index, total):
            block = reads_at.at(ids, index, 2)
            rows = ops.reshape(ops.take(table, ops.reshape(block, (-1,)), axis=0),
                               (batch, block.shape[1], reads_at.size, width))
            part = combine(rows, *(reads_at.at(t, index) for t in read_tensors))
            start, size = (0, index * reads_at.size, 0), (batch, reads_at.size, out_width)
            return ops.slice_update(total, start, ops.slice(total, start, size) + part)

        return ops.fori_loop(0, reads_at.count, read, total)

    total = ops.zeros((batch, reads_at.padded, out_width), "float32")
    for h0 in range(0, num_hashes, group):
        h1 = min(num_hashes, h0 + group)
        table = scatter(writes.table_rows(write_codes[:, h0:h1], write_mask, num_buckets))
        table = _remote(table, axis, size, causal)
        total = gather(table, reads_at.table_rows(read_codes[:, h0:h1], read_mask, num_buckets), total)
    return keep_rows(read_mask, total[:, :ops.shape(read_codes)[2]] / num_hashes)


def _outer_term(axis, size, write_codes, write_mask, left, right, read_codes, read_mask, weight, num_buckets,
                causal):
    """(1/m) sum_h <weight_i, O_h[code_hi]> `[B, n, E]` over the other devices' outer-product tables
    O_h[b] = sum_{j: code_hj = b} left_j (x) right_j (left, weight [B, n, W]; right [B, n, E])."""
    width, depth = left.shape[-1], right.shape[-1]

    def outer(left, right):
        return ops.reshape(left[:, :, :, None] * right[:, :, None, :], (ops.shape(left)[0], -1, width * depth))

    def combine(rows, weight):
        batch, group, size = ops.shape(rows)[0], rows.shape[1], ops.shape(rows)[2]
        return ops.einsum("bnw,bhnwe->bne", weight, ops.reshape(rows, (batch, group, size, width, depth)))

    return remote_term(axis, size, (write_codes, write_mask, [left, right]), (read_codes, read_mask, [weight]), outer,
                       combine, width * depth, depth, num_buckets, causal)
