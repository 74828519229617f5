"""LinearRelativeAttention on a sequence split over devices: the kernel state summed (or scanned)
over the mesh and a `horizon` halo of [V | 1] rows from each neighbour."""

from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.linear_relative import causal_kernel_term
from keras_yoso.ops.composite.linear_relative import chunk_rows
from keras_yoso.ops.composite.linear_relative import relative_term
from keras_yoso.ops.parallel import mesh


def block_total(axis, size, phi_q, phi_k, v, scores, horizon, causal, chunk_size):
    """The rows [B, n, dv + 1] of eq. 10 (numerator and denominator) for this device's block of n
    positions, the sequence split over the mesh axis `axis` of `size` devices (inside `shard_map`).

    Device s holds positions s n .. (s + 1) n - 1 of queries and keys (self-attention). Kernel term:
    S = sum_j phi(K_j) (x) [V_j, 1] is a sum, so one psum (bidirectional), or the sum over the
    earlier devices plus the local causal term (an exclusive scan over the devices). Relative term: the
    k rows of [V, 1] just before and after the block come from the neighbours (two ppermutes, the
    horizon halo), the band is computed on [halo, block, halo], and the keys beyond the halo
    share rows 0 and 2k, i.e. the totals of the devices before (after) minus the halo (exclusive
    scans of the [B, dv + 1] block totals). Needs n >= k (ValueError); Lq == Lk unless bidirectional
    without relative positions (the caller keeps other sequences whole).
    """
    block = _backend.static_shape(phi_q)[1]
    if scores is not None and block is not None and block < horizon:
        raise ValueError(f"sequence parallelism over {size} devices gives each device {block} positions of the "
                         f"{block * size}, fewer than horizon={horizon}: the relative-position halo comes from one "
                         f"neighbour, so the length must be at least {size} * {horizon} = {size * horizon}")
    chunk = chunk_rows(chunk_size, ops.shape(phi_q)[1])
    local = ops.einsum("bjd,bje->bde", phi_k, v)
    if causal:
        earlier = mesh.exclusive_scan(local, axis, size)
        total = causal_kernel_term(phi_q, phi_k, v, chunk) + ops.einsum("bid,bde->bie", phi_q, earlier)
    else:
        total = ops.einsum("bid,bde->bie", phi_q, mesh.psum(local, axis))
    if scores is None:
        return total
    before_halo = mesh.from_neighbour(v[:, -horizon:], axis, size, 1)
    after_halo = ops.zeros_like(before_halo) if causal else mesh.from_neighbour(v[:, :horizon], axis, size, -1)
    keys = ops.concatenate([before_halo, v, after_halo], axis=1)
    total = total + relative_term(scores, keys, horizon, causal, chunk, key_offset=horizon)
    totals = ops.sum(v, axis=1)
    earlier = mesh.exclusive_scan(totals, axis, size)
    total = total + scores[:, :, :1] * (earlier - ops.sum(before_halo, axis=1))[:, None, :]
    if not causal:
        later = mesh.exclusive_scan(totals, axis, size, -1)
        total = total + scores[:, :, -1:] * (later - ops.sum(after_halo, axis=1))[:, None, :]
    return total
