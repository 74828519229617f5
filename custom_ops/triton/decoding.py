"""The decoding step of causal YOSO (the primitive lsh_cumulation_step; GPU-DESIGN.md §2.5): T new positions over
the bucket tables of the earlier ones.

Per (b, h), in position order t, key t's value joins bucket kc[b, h, t] (where its mask is nonzero), then query t
reads bucket qc[b, h, t], so it sees the earlier positions and the new keys s <= t:

    out[b, t] = [qmask[b, t] != 0] / m * sum_h ( tables[b, h, qc[b, h, t]]
                                                 + sum_{s <= t, kmask[b, s] != 0, kc[b, h, s] = qc[b, h, t]} value[b, s] )
    tables_out[b, h] = tables[b, h] + sum_{s: kmask[b, s] != 0} e_{kc[b, h, s]} value[b, s]

tables, tables_out float32 [B, m, num_buckets, D] (tables_out may be tables: updated in place), value [B, T, D] ->
out [B, T, D] in value's dtype. Codes lie in [0, num_buckets) (the C ABI checks them first). Two kernels, in this
order on one stream:

- `decode_outputs_kernel`, grid (B, cdiv(T, BLOCK_T), cdiv(D, BLOCK_D)): reads the old tables (gathered by query
  code) and the chunk's own earlier keys (a [BLOCK_T, BLOCK_S] code-equality mask times the values,
  `lower_bound._mask_sums`: exact products, on tensor cores for fp16 and bf16 rows; fp32 sums), sums the hashes in
  order, writes every element of out. Reads the tables only.
- `decode_update_kernel`, grid (B * m, cdiv(D, BLOCK_D)): adds each kept new key's value to its bucket row of
  tables_out, in position order, one program per (b, h) and columns: each table row has one writer, so the update
  is race-free and deterministic; it reads the rows it writes only after the outputs kernel has finished.

Where tables_out is not tables, the launcher first copies tables into tables_out (the C++ plan's copy step).
"""

import torch
import triton
import triton.language as tl

from lower_bound import _mask_sums

# Positions per program (per row dtype: the largest that ptxas compiles without spills on sm_80 and sm_90, aot.py
# checks) and per step of the inner walk, columns per program.
BLOCK_T = {"fp32": 16, "fp16": 32, "bf16": 32}
BLOCK_S = 16
BLOCK_D = 64
NUM_WARPS = 4


@triton.jit
def decode_outputs_kernel(tables_ptr, query_codes_ptr, query_mask_ptr, key_codes_ptr, key_mask_ptr, value_ptr,
                          out_ptr, num_hashes, length, width, num_buckets, inv_num_hashes,
                          BLOCK_T: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """out [B, T, D] (module docstring) from the old tables. Grid (B, cdiv(T, BLOCK_T), cdiv(D, BLOCK_D))."""
    batch = tl.program_id(0)
    positions = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    inside = positions < length
    in_cols = cols < width
    row0 = batch.to(tl.int64) * length
    kept = tl.load(query_mask_ptr + row0 + positions, mask=inside, other=0.0) != 0
    total = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    last = tl.minimum(tl.program_id(1) * BLOCK_T + BLOCK_T, length)
    for h in range(num_hashes):
        bh = batch.to(tl.int64) * num_hashes + h
        code = tl.load(query_codes_ptr + bh * length + positions, mask=kept, other=0)
        total += tl.load(tables_ptr + (bh * num_buckets + code)[:, None] * width + cols[None, :],
                         mask=kept[:, None] & in_cols[None, :], other=0.0)
        for start in range(0, last, BLOCK_S):
            keys = start + tl.arange(0, BLOCK_S)
            key_inside = keys < length
            key_kept = tl.load(key_mask_ptr + row0 + keys, mask=key_inside, other=0.0) != 0
            key_code = tl.load(key_codes_ptr + bh * length + keys, mask=key_kept, other=-1)
            hit = (code[:, None] == key_code[None, :]) & (keys[None, :] <= positions[:, None]) & key_kept[None, :]
            values = tl.load(value_ptr + (row0 + keys)[:, None] * width + cols[None, :],
                             mask=key_kept[:, None] & in_cols[None, :], other=0.0)
            total = _mask_sums(hit, values, total)
    out = tl.where(kept[:, None], total * inv_num_hashes, 0.0)
    tl.store(out_ptr + (row0 + positions)[:, None] * width + cols[None, :], out.to(out_ptr.dtype.element_ty),
             mask=inside[:, None] & in_cols[None, :])


@triton.jit
def decode_update_kernel(tables_ptr, key_codes_ptr, key_mask_ptr, value_ptr, num_hashes, length, width,
                         num_buckets, BLOCK_D: tl.constexpr):
    """tables [B, m, num_buckets, D] float32 += the kept new keys' values at their codes, in position order.
    Grid (B * m, cdiv(D, BLOCK_D))."""
    bh = tl.program_id(0).to(tl.int64)
    batch = bh // num_hashes
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_cols = cols < width
    for t in range(length):
        if tl.load(key_mask_ptr + batch * length + t) != 0:
            code = tl.load(key_codes_ptr + bh * length + t)
            row = tables_ptr + (bh * num_buckets + code) * width + cols
            value = tl.load(value_ptr + (batch * length + t) * width + cols, mask=in_cols, other=0.0)
            tl.store(row, tl.load(row, mask=in_cols, other=0.0) + value.to(tl.float32), mask=in_cols)


def lsh_cumulation_step(query_mask, query_codes, key_mask, key_codes, value, tables, out=None, tables_out=None):
    """The primitive lsh_cumulation_step (module docstring) on torch tensors of one device: masks float32 [B, T],
    codes int32 [B, m, T] in [0, num_buckets), value [B, T, D], tables float32 [B, m, num_buckets, D] -> (out,
    tables_out), written into `out` and `tables_out` when given (tables_out may be tables)."""
    batch, num_hashes, length = query_codes.shape
    num_buckets, width = tables.shape[2], tables.shape[3]
    if out is None:
        out = torch.empty((batch, length, width), dtype=value.dtype, device=value.device)
    if tables_out is None:
        tables_out = torch.empty_like(tables)
    masks = [m.to(torch.float32).contiguous() for m in (query_mask, key_mask)]
    codes = [c.to(torch.int32).contiguous() for c in (query_codes, key_codes)]
    if out.numel():
        block_t = BLOCK_T[{torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[value.dtype]]
        grid = (batch, triton.cdiv(length, block_t), triton.cdiv(width, BLOCK_D))
        decode_outputs_kernel[grid](tables, codes[0], masks[0], codes[1], masks[1], value.contiguous(), out,
                                    num_hashes, length, width, num_buckets, 1.0 / num_hashes, BLOCK_T=block_t,
                                    BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
    if tables_out.data_ptr() != tables.data_ptr():
        tables_out.copy_(tables)
    if batch * num_hashes * width:
        decode_update_kernel[(batch * num_hashes, triton.cdiv(width, BLOCK_D))](
            tables_out, codes[1], masks[1], value.contiguous(), num_hashes, length, width, num_buckets,
            BLOCK_D=BLOCK_D, num_warps=NUM_WARPS)
    return out, tables_out
