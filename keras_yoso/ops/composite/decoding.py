"""The decoding step of causal YOSO in `keras.ops`: T new positions over the bucket tables of the
earlier ones (eq. 2 as linear attention with one-hot features)."""

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.causal import causal_cumulation
from keras_yoso.ops.composite.chunking import f32
from keras_yoso.ops.composite.masking import keep_rows


def lsh_cumulation_step(query_mask, query_codes, key_mask, key_codes, value, tables):
    """(out [B, T, D] float32, tables_out [B, m, R, D] float32) of the primitive lsh_cumulation_step:
    out_i = qmask_i (1/m) sum_h (T_h[qc_hi] + sum_{j <= i, kc_hj == qc_hi, kept} v_j), and the tables
    gain the kept keys' values (R = num_buckets, the tables' axis 2).

    One position (T = 1, the token-by-token loop): its key is the only new one, so the query reads
    the updated tables, and the update is a scatter of one row per (row, hash) that a compiled loop
    can do in place. T > 1 (a prefill chunk): the old tables plus the chunk's own causal cumulation.
    """
    batch, num_hashes, length = ops.shape(query_codes)[0], query_codes.shape[1], ops.shape(query_codes)[2]
    buckets, width = tables.shape[2], tables.shape[3]
    rows = batch * num_hashes
    base = ops.reshape(ops.arange(rows, dtype="int32") * buckets, (batch, num_hashes, 1))
    values = keep_rows(key_mask, f32(value))
    kept = ops.broadcast_to(values[:, None], (batch, num_hashes, length, width))
    kept, key_rows = ops.reshape(kept, (-1, width)), ops.reshape(key_codes + base, (-1,))
    flat = ops.reshape(f32(tables), (-1, width))
    single = _backend.static_shape(query_codes)[2] == 1
    if single:  # one key per (row, hash): distinct rows, updated in place (no table-sized temporary)
        updated = ops.scatter_update(flat, key_rows[:, None], ops.take(flat, key_rows, axis=0) + kept)
    else:
        updated = flat + _backend.segment_sum(kept, key_rows, rows * buckets)

    def read(state):
        gathered = ops.take(state, ops.reshape(query_codes + base, (-1,)), axis=0)
        return ops.mean(ops.reshape(gathered, (batch, num_hashes, length, width)), axis=1)

    if single:
        out = read(updated)
    else:
        out = read(flat) + causal_cumulation(query_mask, query_codes, None, key_mask, key_codes, None, value,
                                             buckets, 1)
    return keep_rows(query_mask, out), ops.reshape(updated, ops.shape(tables))
