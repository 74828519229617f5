"""Sign-random-projection hash codes (appendix §1.2): the Gaussian and the Hadamard projections."""

import numpy as np
from keras import ops

from keras_yoso import _backend
from keras_yoso.ops.composite.chunking import COMPUTE_DTYPE
from keras_yoso.ops.composite.chunking import f32


@_backend.compiled(static_argnames=("num_hashes", "hash_code_len", "method"))
def hash_codes(x, params, num_hashes, hash_code_len, method):
    """Sign random projections: int32 `[B, m, N]` codes of x `[B, N, d]` (appendix §1.2).

    params: from `keras_yoso.ops.hash_parameters`: the Gaussian projection `[d, m tau]`, or the
    Hadamard signs, turned here into the first d rows of the Hadamard hash's matrix. Both
    methods are then one projection matmul: bit i of hash h is `<x, projection[:, h tau + i]> > 0`
    (NaN is not > 0: a NaN row hashes to code 0).
    """
    batch, length, dim = ops.shape(x)
    bits = num_hashes * hash_code_len
    projection = params if method == "gaussian" else hadamard_projection(params, dim, bits,
                                                                         method == "hadamard_interleaved")
    projected = ops.einsum("bnd,dk->bnk", f32(x), projection[:, :bits])
    signs = ops.reshape(ops.cast(ops.greater(projected, 0.0), "int32"), (batch, length, num_hashes, hash_code_len))
    weights = ops.convert_to_tensor(np.left_shift(1, np.arange(hash_code_len)).astype(np.int32))
    return ops.transpose(ops.sum(signs * weights, axis=-1), (0, 2, 1))


def gaussian_hash_codes(x, projection, num_hashes, hash_code_len):
    """The primitive gaussian_hash_codes (`hash_codes` with method "gaussian")."""
    return hash_codes(x, projection, num_hashes, hash_code_len, "gaussian")


def hadamard_hash_codes(x, signs, num_hashes, hash_code_len):
    """The primitive hadamard_hash_codes (`hash_codes` with method "hadamard")."""
    return hash_codes(x, signs, num_hashes, hash_code_len, "hadamard")


def hadamard_interleaved_hash_codes(x, signs, num_hashes, hash_code_len):
    """The primitive hadamard_interleaved_hash_codes (`hash_codes` with method "hadamard_interleaved")."""
    return hash_codes(x, signs, num_hashes, hash_code_len, "hadamard_interleaved")


def hadamard_transform(y):
    """Unnormalized Walsh-Hadamard transform (Sylvester order) over the last axis (a power of two)."""
    size = y.shape[-1]
    lead = ops.shape(y)[:-1]
    length = 1
    while length < size:
        z = ops.reshape(y, (*lead, size // (2 * length), 2, length))
        a, b = z[..., 0, :], z[..., 1, :]
        y = ops.reshape(ops.stack([a + b, a - b], axis=-2), (*lead, size))
        length *= 2
    return y


def hadamard_projection(signs, dim, num_bits, interleaved):
    """The `[dim, num_bits]` matrix of the Hadamard hash: column k is row r of
    H D3 H D2 H D1 of block q (D_s = diag(signs[q, s - 1]), H the p x p Sylvester matrix), so
    `x @ projection` is the block-q transform of x zero-padded to p (appendix §1.2); (q, r) =
    (k // p, k % p) contiguous ("hadamard"), (k % num_blocks, k // num_blocks) interleaved
    ("hadamard_interleaved"; the C++ HadamardProjectionRow).

    signs: float32 `[num_blocks, 3, p]` of +-1. The entries are integers of magnitude <= p^2
    (exact in float32 for p <= 4096), so a structural zero of the transform is an exact zero here.
    """
    num_blocks, _, padded = signs.shape
    eye = ops.eye(padded, dtype=COMPUTE_DTYPE)[None]          # rows: unit vectors e_k
    y = eye * signs[:, 0, None, :]
    y = hadamard_transform(y) * signs[:, 1, None, :]
    y = hadamard_transform(y) * signs[:, 2, None, :]
    y = hadamard_transform(y)                                 # [blocks, k, r]: transform of e_k
    order = (2, 0) if interleaved else (0, 2)                  # column index k = (r, q) or (q, r)
    columns = ops.reshape(ops.transpose(y[:, :dim, :], (1, *order)), (dim, num_blocks * padded))
    return columns[:, :num_bits]
