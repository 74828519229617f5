"""K6 and K7 of the bucket-sorted YOSO GPU kernels (GPU-DESIGN.md §2.3): the eq. 4 lower-bound gradients.

The primitive lower_bound_gradients (causal = 0) returns, over kept pairs (qmask[b, i] != 0, kmask[b, j] != 0,
codes in [0, num_buckets)),

    dQ[b, i] = 1/m sum_h sum_j [qc[b, h, i] == kc[b, h, j]] <dY[b, i], V[b, j]> K[b, j]
    dK[b, j] = 1/m sum_h sum_i [qc[b, h, i] == kc[b, h, j]] <dY[b, i], V[b, j]> Q[b, i]

(paper eq. 4 without its factor tau / 2, which the library applies elsewhere: see
keras_yoso/ops/composite/causal.py, directed_lower_bound_gradients, and tests/numpy_reference.py,
yoso_lower_bound_gradients), masked rows zero. Q, K [B, N, d]; V, dY [B, N, D]; dQ, dK in Q's dtype.

Per hash h and bucket c (queries Q_c, dY_c and keys K_c, V_c, both sorted by bucket_sort.py):

- pair form (`lower_bound_pairs_kernel`): W = dY_c V_c^T masked by code equality, dQ_c += W K_c, dK_c += W^T Q_c,
  (2 D + 4 d) n_q n_k FLOPs. One program per (b, h, BLOCK_Q consecutive sorted queries) walks the keys of the
  buckets its queries belong to in tiles of BLOCK_K (one contiguous range of sorted keys: the keys of a
  table-form bucket inside it are masked out, and such a bucket has all its queries in the window, so that
  waste is at most BLOCK_Q pairs per key); a bucket that straddles two query windows has its keys visited by
  both, each adding its own queries' share of dK.
- table form (`lower_bound_tables_kernel`): T_c = V_c^T K_c and U_c = dY_c^T Q_c ([D, d], fp32), then
  dQ_c = dY_c T_c and dK_c = V_c U_c, 4 D d (n_q + n_k) FLOPs, linear in the bucket's size whatever the skew.
  One program per (b, h, TABLE_BUCKETS consecutive buckets), which it takes one after another.

Each bucket takes the cheaper form as measured (`_uses_table_form`, PAIR_COST_FACTOR) (the same integer test in both kernels, so every bucket
is counted exactly once); `form` forces one of them for tests and measurements. Both kernels add fp32 partial
rows into accumulators dQacc [B, Nq, d], dKacc [B, Nk, d] (zeroed by the launcher) with relaxed atomic adds
(`sem="relaxed"`: a plain RED, no fences). Within one hash a row is written by one pair window (two where its
bucket straddles a window edge, keys only) or one table program, so only the m hashes meet on a row.
K7 `finalize_rows_kernel` writes dQ = [mask != 0] * scale * dQacc in the output dtype (scale = 1/m here).

Products: 16-bit inputs run tl.dot on their own dtype with fp32 accumulation (W and the tables are rounded to
that dtype before their second product, as FlashAttention rounds P); float32 inputs take `precision`:
"tf32" (the GPU default, GPU-DESIGN.md §2.4: 2e-3 relative) or "ieee" (exact fp32 on FMA units, equality with
the CPU kernels; 3xTF32, the other exact mode of §2.4, spills with these tiles and is left to tuning).
Tiles hold whole rows: d and D at most MAX_WIDTH; row offsets are int32 within a batch row, so
N * max(d, D) < 2^31.
"""

import os

import torch
import triton
import triton.language as tl

from bucket_sort import bucket_sort
from grid import row_and_block, rows_grid

# Tiles per (arch, operands, widest row): pair form (BLOCK_Q queries, BLOCK_K keys, warps), table form (BLOCK_R
# rows, warps); operands "16bit" (fp16, bf16), "tf32" (fp32 rows, tf32 products) or "ieee" (exact fp32, FMA).
# The largest tiles that ptxas compiles without spills (aot.py checks every built variant); their speed is for a
# GPU run to tune (GPU-DESIGN.md, stage C).
_PAIR_TILES = {
    (80, "16bit"): {64: (64, 32, 8), 128: (32, 32, 8)},
    (80, "tf32"): {64: (64, 32, 8), 128: (32, 32, 8)},
    (80, "ieee"): {64: (16, 32, 8), 128: (32, 16, 8)},
    (90, "16bit"): {64: (64, 64, 8), 128: (32, 64, 8)},
    (90, "tf32"): {64: (64, 64, 8), 128: (32, 32, 8)},
    (90, "ieee"): {64: (32, 16, 8), 128: (32, 16, 8)},
}
_TABLE_TILES = {
    (80, "16bit"): {64: (64, 4), 128: (64, 8)},
    (80, "tf32"): {64: (64, 8), 128: (32, 8)},
    (80, "ieee"): {64: (16, 8), 128: (16, 8)},
    (90, "16bit"): {64: (64, 4), 128: (64, 8)},
    (90, "tf32"): {64: (64, 8), 128: (32, 8)},
    (90, "ieee"): {64: (32, 8), 128: (16, 8)},
}
# How many times its FLOP count the pair form costs against the table form's, measured on an H200
# (2026-11-28, bf16, B*H = 32, d = D = 64, m = 32; docs/data/gpu_2026-11-28/eq4_forms.txt): the table form
# was faster at 16 and 64 rows per bucket (15.3 against 34.8 ms at 16,384 tokens, tau 8) and slower at 4 rows
# (tau 12). With 8 the cost test takes the faster form at each measured size; tuning the pair tiles lowers it.
PAIR_COST_FACTOR = tl.constexpr(8)
# Buckets per table-form program (most buckets take the pair form: their programs only read the sizes).
TABLE_BUCKETS = 16
FINALIZE_BLOCK = 1024
NUM_WARPS = 4
# Widest d or D a tile holds.
MAX_WIDTH = 128
# form -> the FORM constexpr of the kernels.
FORMS = {"auto": 0, "pair": 1, "table": 2}
PRECISIONS = ("tf32", "ieee")


# Variants whose tiles differ from the tables above, found by aot.py's checks (2026-11-28): the deterministic mode's
# plain adds keep the accumulator tile live, and a few variants spilled a few bytes. (arch, operands, tile width,
# widths multiples of 16, deterministic) -> {"pair": (BLOCK_Q, BLOCK_K, warps)} and / or {"table": (BLOCK_R, warps)}.
_TILE_OVERRIDES = {
    (80, "tf32", 16, True, True): {"pair": (64, 32, 4)},
    (80, "tf32", 128, False, True): {"table": (16, 8)},
    (80, "ieee", 128, False, False): {"pair": (16, 32, 8)},
    (80, "ieee", 64, False, True): {"pair": (16, 32, 4)},
    (90, "tf32", 128, False, True): {"table": (16, 8)},
    (90, "ieee", 64, True, True): {"table": (16, 8)},
    (90, "ieee", 64, False, True): {"table": (16, 8)},
    (90, "ieee", 128, True, True): {"pair": (32, 16, 4)},
}
# The deterministic mode of exact fp32 products takes tiles up to this width: at 128 columns its table form spills
# whatever its tiles (its d x D fp32 table and the accumulator rows it adds to), so those variants are not built.
MAX_DETERMINISTIC_IEEE_WIDTH = 64


def eq4_tiles(arch, float32, precision, width, aligned=True, deterministic=False):
    """(pair, table) launch settings for sm_<arch> (80: any arch below 90), float32 rows or not, `precision`, tile
    width `width` (block_width of max(d, D); 64 or 128 for widths that are not multiples of 16: aligned False)
    and the mode: dicts of the kernels' tile constexprs and num_warps."""
    operands = precision if float32 else "16bit"
    key = (90 if arch >= 90 else 80, operands)
    block_q, block_k, pair_warps = _PAIR_TILES[key][max(64, width)]
    block_r, table_warps = _TABLE_TILES[key][max(64, width)]
    override = _TILE_OVERRIDES.get((key[0], operands, width, aligned, deterministic), {})
    block_q, block_k, pair_warps = override.get("pair", (block_q, block_k, pair_warps))
    block_r, table_warps = override.get("table", (block_r, table_warps))
    return (dict(BLOCK_Q=block_q, BLOCK_K=block_k, num_warps=pair_warps),
            dict(BLOCK_R=block_r, num_warps=table_warps))


# Triton 3.9's interpreter multiplies bfloat16 tl.dot operands as their raw uint16 bits (its create_dot widens
# only fp8), so interpreted, bfloat16 operands are widened to fp32 first: exact, as the tensor cores' products are.
_WIDEN_BF16_DOTS = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def block_width(width):
    """Tile columns of rows of `width`: a power of two >= 16 (tl.dot's least size)."""
    return max(16, triton.next_power_of_2(width))


@triton.jit
def _uses_table_form(num_q, num_k, dim, value_dim, FORM: tl.constexpr):
    """True where a bucket of num_q queries and num_k keys takes the table form: forced (FORM 2), never
    (FORM 1), or where it costs less (FORM 0): 4 D d (n_q + n_k) < PAIR_COST_FACTOR (2 D + 4 d) n_q n_k, its
    FLOPs against the pair form's weighted by their measured efficiency. int64 math: exact and identical in
    every kernel for lengths below 2^26."""
    if FORM == 2:
        uses = num_q >= 0
    elif FORM == 1:
        uses = num_q < 0
    else:
        nq = num_q.to(tl.int64)
        nk = num_k.to(tl.int64)
        uses = 2 * value_dim * dim * (nq + nk) < PAIR_COST_FACTOR * (value_dim + 2 * dim) * nq * nk
    return uses


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr):
    """tl.dot(a, b, acc) with fp32 accumulation (see _WIDEN_BF16_DOTS)."""
    if _WIDEN_BF16_DOTS:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=tl.float32)


@triton.jit
def _mask_sums(mask, rows, acc):
    """acc + mask @ rows in fp32 for a boolean `mask` [M, K] and `rows` [K, N]: per output row, the sum of the rows
    its mask takes. Every product (by 0 or 1) is exact: on tensor cores in the rows' dtype for fp16 and bf16 rows,
    in IEEE fp32 (FMA) for fp32 rows. The mask becomes 0 and 1 through fp32 (Triton 3.9's interpreter turns int1
    straight into bfloat16 as raw bits, so True is not 1.0 there; compiled, the two conversions are one)."""
    return _dot(mask.to(tl.float32).to(rows.dtype), rows, acc, "ieee")


@triton.jit
def _load_rows(base, rows, valid, cols, width):
    """Rows `rows` of a [N, width] matrix at `base` as a [len(rows), len(cols)] tile, 0 where not valid
    (int32 offsets: N * width < 2^31)."""
    return tl.load(base + (rows[:, None] * width + cols[None, :]),
                   mask=valid[:, None] & (cols < width)[None, :], other=0.0)


@triton.jit
def _add_rows(base, rows, valid, cols, width, x, DETERMINISTIC: tl.constexpr):
    """acc[rows] += x for the valid rows of a [N, width] fp32 accumulator at `base`: relaxed atomics, or, in the
    deterministic mode (where this program is the rows' only writer in its launch), a plain load and store."""
    pointers = base + (rows[:, None] * width + cols[None, :])
    valid = valid[:, None] & (cols < width)[None, :]
    if DETERMINISTIC:
        tl.store(pointers, tl.load(pointers, mask=valid, other=0.0) + x, mask=valid)
    else:
        tl.atomic_add(pointers, x, mask=valid, sem="relaxed")


@triton.jit
def lower_bound_pairs_kernel(q_ptr, k_ptr, v_ptr, dy_ptr, q_codes_ptr, k_codes_ptr, q_offsets_ptr, q_perm_ptr,
                             k_offsets_ptr, k_perm_ptr, dq_acc_ptr, dk_acc_ptr, num_hashes, num_queries, num_keys,
                             dim, value_dim, num_buckets, hash_index, FORM: tl.constexpr, PRECISION: tl.constexpr,
                             DETERMINISTIC: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                             BLOCK_DIM: tl.constexpr, BLOCK_VDIM: tl.constexpr):
    """Pair form over a window of BLOCK_Q sorted queries. Q [B, Nq, d], K [B, Nk, d], V [B, Nk, D],
    dY [B, Nq, D] (one dtype), codes int32 [B, m, N], the two sorts of bucket_sort, fp32 accumulators
    dQacc [B, Nq, d], dKacc [B, Nk, d].

    Grid rows_grid(B * m, cdiv(Nq, BLOCK_Q)) (grid.py) with hash_index -1. Deterministic mode (DETERMINISTIC): one
    hash per launch, grid rows_grid(B, cdiv(Nq, BLOCK_Q)) with hash_index = h, and dQ only (a query row belongs to
    one window), added with plain loads and stores; dK is the same kernel with the roles of the two sides exchanged
    (dK_j = sum_i <V_j, dY_i> Q_i is dQ's formula with (Q, dY) and (K, V) swapped; the form test is symmetric).
    """
    row, block = row_and_block(tl.cdiv(num_queries, BLOCK_Q))
    bh = tl.where(hash_index >= 0, row * num_hashes + hash_index, row)
    batch = bh // num_hashes
    q_offsets = q_offsets_ptr + bh * (num_buckets + 1)
    k_offsets = k_offsets_ptr + bh * (num_buckets + 1)
    pos = block * BLOCK_Q + tl.arange(0, BLOCK_Q)
    inside = pos < tl.load(q_offsets + num_buckets)
    q_rows = tl.load(q_perm_ptr + bh * num_queries + pos, mask=inside, other=0)
    q_code = tl.load(q_codes_ptr + bh * num_queries + q_rows, mask=inside, other=0)
    num_q = tl.load(q_offsets + q_code + 1, mask=inside, other=0) - tl.load(q_offsets + q_code, mask=inside, other=0)
    k_first = tl.load(k_offsets + q_code, mask=inside, other=0)
    num_k = tl.load(k_offsets + q_code + 1, mask=inside, other=0) - k_first
    pair = inside & (num_k > 0) & ~_uses_table_form(num_q, num_k, dim, value_dim, FORM)
    k_begin = tl.min(tl.where(pair, k_first, 2147483647))
    k_end = tl.max(tl.where(pair, k_first + num_k, 0))
    if k_begin < k_end:
        cols = tl.arange(0, BLOCK_DIM)
        vcols = tl.arange(0, BLOCK_VDIM)
        q = _load_rows(q_ptr + batch * num_queries * dim, q_rows, pair, cols, dim)
        dy = _load_rows(dy_ptr + batch * num_queries * value_dim, q_rows, pair, vcols, value_dim)
        dq = tl.zeros([BLOCK_Q, BLOCK_DIM], tl.float32)
        for start in range(k_begin, k_end, BLOCK_K):
            k_pos = start + tl.arange(0, BLOCK_K)
            k_inside = k_pos < k_end
            k_rows = tl.load(k_perm_ptr + bh * num_keys + k_pos, mask=k_inside, other=0)
            k_code = tl.load(k_codes_ptr + bh * num_keys + k_rows, mask=k_inside, other=-1)
            k = _load_rows(k_ptr + batch * num_keys * dim, k_rows, k_inside, cols, dim)
            v = _load_rows(v_ptr + batch * num_keys * value_dim, k_rows, k_inside, vcols, value_dim)
            hit = pair[:, None] & k_inside[None, :] & (q_code[:, None] == k_code[None, :])
            w = _dot(dy, tl.trans(v), None, PRECISION)
            w = tl.where(hit, w, 0.0).to(q.dtype)
            dq = _dot(w, k, dq, PRECISION)
            if not DETERMINISTIC:
                dk = _dot(tl.trans(w), q, None, PRECISION)
                _add_rows(dk_acc_ptr + batch * num_keys * dim, k_rows, tl.max(hit.to(tl.int32), axis=0) > 0, cols,
                          dim, dk, False)
        _add_rows(dq_acc_ptr + batch * num_queries * dim, q_rows, pair, cols, dim, dq, DETERMINISTIC)


@triton.jit
def _product_rows(a_ptr, b_ptr, rows_ptr, begin, end, a_width, b_width, PRECISION: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """sum over the sorted positions begin..end of A[rows[p]]^T B[rows[p]]: [BLOCK_A, BLOCK_B] fp32, A [N, a_width]
    and B [N, b_width] at a_ptr, b_ptr."""
    a_cols = tl.arange(0, BLOCK_A)
    b_cols = tl.arange(0, BLOCK_B)
    table = tl.zeros([BLOCK_A, BLOCK_B], tl.float32)
    for start in range(begin, end, BLOCK_R):
        pos = start + tl.arange(0, BLOCK_R)
        inside = pos < end
        rows = tl.load(rows_ptr + pos, mask=inside, other=0)
        a = _load_rows(a_ptr, rows, inside, a_cols, a_width)
        b = _load_rows(b_ptr, rows, inside, b_cols, b_width)
        table = _dot(tl.trans(a), b, table, PRECISION)
    return table


@triton.jit
def _apply_table(x_ptr, rows_ptr, begin, end, x_width, table, acc_ptr, out_width, PRECISION: tl.constexpr,
                 DETERMINISTIC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_X: tl.constexpr, BLOCK_OUT: tl.constexpr):
    """acc[rows[p]] += X[rows[p]] @ table for the sorted positions begin..end (X [N, x_width], acc [N, out_width])."""
    x_cols = tl.arange(0, BLOCK_X)
    out_cols = tl.arange(0, BLOCK_OUT)
    for start in range(begin, end, BLOCK_R):
        pos = start + tl.arange(0, BLOCK_R)
        inside = pos < end
        rows = tl.load(rows_ptr + pos, mask=inside, other=0)
        x = _load_rows(x_ptr, rows, inside, x_cols, x_width)
        _add_rows(acc_ptr, rows, inside, out_cols, out_width, _dot(x, table.to(x.dtype), None, PRECISION),
                  DETERMINISTIC)


@triton.jit
def lower_bound_tables_kernel(q_ptr, k_ptr, v_ptr, dy_ptr, q_offsets_ptr, q_perm_ptr, k_offsets_ptr, k_perm_ptr,
                              dq_acc_ptr, dk_acc_ptr, num_hashes, num_queries, num_keys, dim, value_dim, num_buckets,
                              hash_index, FORM: tl.constexpr, PRECISION: tl.constexpr, DETERMINISTIC: tl.constexpr,
                              BUCKETS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_DIM: tl.constexpr,
                              BLOCK_VDIM: tl.constexpr):
    """Table form of the buckets that take it among BUCKETS consecutive ones (arguments as
    lower_bound_pairs_kernel), one after another: T = V_c^T K_c, dQ_c += dY_c T; U = dY_c^T Q_c, dK_c += V_c U.

    Grid rows_grid(B * m, cdiv(num_buckets, BUCKETS)) (grid.py) with hash_index -1; deterministic mode:
    rows_grid(B, cdiv(num_buckets, BUCKETS)) per hash h = hash_index, plain adds (a bucket's rows have one writer
    in the launch).
    """
    row, block = row_and_block(tl.cdiv(num_buckets, BUCKETS))
    bh = tl.where(hash_index >= 0, row * num_hashes + hash_index, row)
    first = block * BUCKETS
    batch = bh // num_hashes
    q_offsets = q_offsets_ptr + bh * (num_buckets + 1)
    k_offsets = k_offsets_ptr + bh * (num_buckets + 1)
    q = q_ptr + batch * num_queries * dim
    k = k_ptr + batch * num_keys * dim
    v = v_ptr + batch * num_keys * value_dim
    dy = dy_ptr + batch * num_queries * value_dim
    q_perm = q_perm_ptr + bh * num_queries
    k_perm = k_perm_ptr + bh * num_keys
    for bucket in range(first, tl.minimum(first + BUCKETS, num_buckets)):
        q_begin = tl.load(q_offsets + bucket)
        q_end = tl.load(q_offsets + bucket + 1)
        k_begin = tl.load(k_offsets + bucket)
        k_end = tl.load(k_offsets + bucket + 1)
        if (q_begin < q_end) & (k_begin < k_end) & _uses_table_form(q_end - q_begin, k_end - k_begin, dim,
                                                                    value_dim, FORM):
            t = _product_rows(v, k, k_perm, k_begin, k_end, value_dim, dim, PRECISION, BLOCK_R, BLOCK_VDIM,
                              BLOCK_DIM)
            _apply_table(dy, q_perm, q_begin, q_end, value_dim, t, dq_acc_ptr + batch * num_queries * dim, dim,
                         PRECISION, DETERMINISTIC, BLOCK_R, BLOCK_VDIM, BLOCK_DIM)
            u = _product_rows(dy, q, q_perm, q_begin, q_end, value_dim, dim, PRECISION, BLOCK_R, BLOCK_VDIM,
                              BLOCK_DIM)
            _apply_table(v, k_perm, k_begin, k_end, value_dim, u, dk_acc_ptr + batch * num_keys * dim, dim,
                         PRECISION, DETERMINISTIC, BLOCK_R, BLOCK_VDIM, BLOCK_DIM)


@triton.jit
def finalize_rows_kernel(acc_ptr, mask_ptr, out_ptr, num_elements, width, scale, BLOCK: tl.constexpr):
    """K7: out [B, N, width] (its own dtype) = [mask[b, n] != 0] * scale * acc (fp32 [B, N, width]), mask float32
    [B, N]; flat over the num_elements = B * N * width elements. Grid (cdiv(num_elements, BLOCK),)."""
    index = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = index < num_elements
    kept = tl.load(mask_ptr + index // width, mask=inside, other=0.0) != 0
    acc = tl.load(acc_ptr + index, mask=inside & kept, other=0.0)
    tl.store(out_ptr + index, (acc * scale).to(out_ptr.dtype.element_ty), mask=inside)


def finalize_rows(acc, mask, scale, out):
    """out [B, N, w] (its own dtype, every element written) = [mask != 0] * scale * acc (K7): acc float32 [B, N, w],
    mask float32 [B, N]; returns out."""
    if out.numel():
        finalize_rows_kernel[(triton.cdiv(out.numel(), FINALIZE_BLOCK),)](
            acc, mask.to(torch.float32).contiguous(), out, out.numel(), acc.shape[2], scale, BLOCK=FINALIZE_BLOCK,
            num_warps=NUM_WARPS)
    return out


def lower_bound_accumulators(query_mask, query_codes, query, key_mask, key_codes, key, value, output_gradient,
                             num_buckets, form="auto", precision="tf32", deterministic=False):
    """(dQacc float32 [B, Nq, d], dKacc float32 [B, Nk, d]): the sums of the module docstring without the 1/m,
    by K1 (both sides) and K6 (`form`: "auto" chooses per bucket, "pair" or "table" forces one). deterministic:
    one launch per hash and kind (dQ pairs, dK pairs, tables), each row added by one program with plain loads
    and stores, the hashes in order: bitwise reproducible, 3 m launches."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {sorted(FORMS)}, got {form!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    batch, num_hashes, num_queries = query_codes.shape
    num_keys = key_codes.shape[2]
    dim, value_dim = query.shape[2], value.shape[2]
    if max(dim, value_dim) > MAX_WIDTH:
        raise ValueError(f"the eq. 4 kernels hold whole rows: d and D must be at most {MAX_WIDTH}, got d={dim}, "
                         f"D={value_dim}")
    device = query.device
    dq_acc = torch.zeros((batch, num_queries, dim), dtype=torch.float32, device=device)
    dk_acc = torch.zeros((batch, num_keys, dim), dtype=torch.float32, device=device)
    if not (batch * num_hashes * num_queries * num_keys * dim * value_dim):
        return dq_acc, dk_acc
    q_offsets, q_perm = bucket_sort(query_codes, query_mask, num_buckets)
    k_offsets, k_perm = bucket_sort(key_codes, key_mask, num_buckets)
    q, k, v, dy = [t.contiguous() for t in (query, key, value.to(query.dtype), output_gradient.to(query.dtype))]
    q_codes, k_codes = query_codes.to(torch.int32).contiguous(), key_codes.to(torch.int32).contiguous()
    float32 = query.dtype == torch.float32
    arch = torch.cuda.get_device_capability(device)[0] * 10 if device.type == "cuda" else 80
    aligned = dim % 16 == 0 and value_dim % 16 == 0
    width = block_width(max(dim, value_dim)) if aligned else max(64, block_width(max(dim, value_dim)))
    pair_tiles, table_tiles = eq4_tiles(arch, float32, precision, width, aligned, deterministic)
    constants = dict(FORM=FORMS[form], PRECISION=precision if float32 else "tf32", DETERMINISTIC=deterministic,
                     BLOCK_DIM=block_width(dim), BLOCK_VDIM=block_width(value_dim))
    queries_side = (q, k, v, dy, q_codes, k_codes, q_offsets, q_perm, k_offsets, k_perm, dq_acc, dk_acc,
                    num_hashes, num_queries, num_keys, dim, value_dim, num_buckets)
    # dK as dQ with the sides exchanged (deterministic mode: the pair kernel adds dQ only).
    keys_side = (k, q, dy, v, k_codes, q_codes, k_offsets, k_perm, q_offsets, q_perm, dk_acc, dq_acc,
                 num_hashes, num_keys, num_queries, dim, value_dim, num_buckets)
    tables = (q, k, v, dy, q_offsets, q_perm, k_offsets, k_perm, dq_acc, dk_acc, num_hashes, num_queries, num_keys,
              dim, value_dim, num_buckets)
    table_grid = triton.cdiv(num_buckets, TABLE_BUCKETS)
    for h in (range(num_hashes) if deterministic else [-1]):
        rows = batch if deterministic else batch * num_hashes
        if form != "table":
            lower_bound_pairs_kernel[rows_grid(rows, triton.cdiv(num_queries, pair_tiles["BLOCK_Q"]))](
                *queries_side, h, **constants, **pair_tiles)
            if deterministic:
                lower_bound_pairs_kernel[rows_grid(rows, triton.cdiv(num_keys, pair_tiles["BLOCK_Q"]))](
                    *keys_side, h, **constants, **pair_tiles)
        if form != "pair":
            lower_bound_tables_kernel[rows_grid(rows, table_grid)](*tables, h, **constants, BUCKETS=TABLE_BUCKETS,
                                                                   **table_tiles)
    return dq_acc, dk_acc


def lower_bound_gradients(query_mask, query_codes, query, key_mask, key_codes, key, value, output_gradient,
                          num_buckets, form="auto", precision="tf32", query_gradient=None, key_gradient=None,
                          deterministic=False):
    """The primitive lower_bound_gradients with causal = 0: (dQ [B, Nq, d], dK [B, Nk, d]) in query's dtype
    (module docstring), written into query_gradient and key_gradient when given; K1, K6 and K7. Masks float32
    [B, N], codes int32 [B, m, N], query [B, Nq, d], key [B, Nk, d], value and output_gradient [B, Nk, D] and
    [B, Nq, D]."""
    dq_acc, dk_acc = lower_bound_accumulators(query_mask, query_codes, query, key_mask, key_codes, key, value,
                                              output_gradient, num_buckets, form, precision, deterministic)
    scale = 1.0 / max(query_codes.shape[1], 1)
    if query_gradient is None:
        query_gradient = torch.empty(dq_acc.shape, dtype=query.dtype, device=query.device)
    if key_gradient is None:
        key_gradient = torch.empty(dk_acc.shape, dtype=query.dtype, device=query.device)
    return (finalize_rows(dq_acc, query_mask, scale, query_gradient),
            finalize_rows(dk_acc, key_mask, scale, key_gradient))
