"""LSH hashing: the random hash functions drawn from a seed, and the codes of vectors.

Paper: Zeng et al., "You Only Sample (Almost) Once", ICML 2021, §3.2 and appendix §1.2
(hyperplane LSH; the fast Hadamard variant).
"""

import functools
import math

import keras
import numpy as np
from keras import ops

from keras_yoso import _backend
from keras_yoso import _validation
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec


def _next_power_of_two(n):
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


def hadamard_blocks(dim, num_hashes, hash_code_len, method):
    """(num_blocks, padded_dim) of the Hadamard hash of `dim`-dim vectors, `num_hashes` hashes of
    `hash_code_len` bits: enough blocks of padded_dim rows for the m tau bits, and for
    "hadamard_interleaved" at least tau, so that a hash's bits come from tau different blocks."""
    padded = _next_power_of_two(dim)
    blocks = -(-num_hashes * hash_code_len // padded)
    return (max(blocks, hash_code_len) if method == "hadamard_interleaved" else blocks), padded


@functools.lru_cache(maxsize=64)
def _numpy_parameters(dim, num_hashes, hash_code_len, seed, method):
    """The hash functions of an int seed, drawn on the host with NumPy's frozen legacy stream, so
    they are the same on every backend, every device and every version of TF, JAX and torch."""
    rng = np.random.RandomState([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF])
    bits = num_hashes * hash_code_len
    if method == "gaussian":
        params = rng.standard_normal((dim, bits)).astype(np.float32)
    else:
        blocks, padded = hadamard_blocks(dim, num_hashes, hash_code_len, method)
        params = (2 * rng.randint(0, 2, size=(blocks, 3, padded)) - 1).astype(np.float32)
    params.setflags(write=False)
    return params


@_backend.traced_as_opaque_call
def _host_parameters(dim, num_hashes, hash_code_len, seed, method):
    return ops.convert_to_tensor(_numpy_parameters(dim, num_hashes, hash_code_len, seed, method))


class _StatelessSeed(keras.random.SeedGenerator):
    """A `[2]` seed tensor in the form `keras.random` accepts: every draw is a stateless function of it."""

    def __init__(self, seed):  # no state variable: nothing to advance
        self._seed = ops.cast(seed, _backend.random_seed_dtype())

    def next(self, ordered=True):
        return self._seed


def _seed_tensor(seed):
    """A `[2]` integer seed tensor, or ValueError."""
    message = f"seed must be an int or an integer tensor of shape [2], got {seed!r}"
    try:
        tensor = ops.convert_to_tensor(seed)
    except (TypeError, ValueError) as error:
        raise ValueError(message) from error
    shape = _backend.static_shape(tensor)
    if "int" not in str(tensor.dtype) or (shape is not None and tuple(shape) != (2,)):
        raise ValueError(message)
    return tensor


def hash_parameters(dim, num_hashes, hash_code_len, seed, method=_validation.DEFAULT_HASH_METHOD):
    """The random hash functions that `hash_codes` draws from `seed`.

    Args:
      dim: d >= 1, the width of the hashed vectors.
      num_hashes, hash_code_len: m >= 1 hashes of tau in [1, 30] bits.
      seed: an int (drawn on the host with NumPy's frozen `RandomState` stream: the same hash
        functions on every backend and device) or a `[2]` integer tensor (drawn with
        `keras.random`, statelessly: fresh functions per training step, backend-specific).
      method: "hadamard_interleaved" (default), "hadamard" or "gaussian" (see `hash_codes`).

    Returns:
      float32: for "gaussian" the projection `[dim, m * tau]` of N(0, 1) entries; for the
      Hadamard methods the diagonal signs `[num_blocks, 3, padded_dim]` (+-1) of the blocks'
      H D3 H D2 H D1, with padded_dim the next power of two >= dim and num_blocks =
      ceil(m tau / padded_dim), at least tau for "hadamard_interleaved" (`hadamard_blocks`).
    """
    dim = _validation.integer(dim, "dim", 1)
    num_hashes = _validation.integer(num_hashes, "num_hashes", 1)
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=False)
    method = _validation.choice(method, "method", _validation.HASH_METHODS)
    return _parameters(dim, num_hashes, hash_code_len, seed, method)


def _parameters(dim, num_hashes, hash_code_len, seed, method):
    """`hash_parameters` of arguments already checked."""
    if _validation.is_integer(seed):
        return _host_parameters(dim, num_hashes, hash_code_len, int(seed), method)
    generator = _StatelessSeed(_seed_tensor(seed))
    bits = num_hashes * hash_code_len
    if method == "gaussian":
        return keras.random.normal((dim, bits), dtype="float32", seed=generator)
    blocks, padded = hadamard_blocks(dim, num_hashes, hash_code_len, method)
    signs = keras.random.randint((blocks, 3, padded), 0, 2, dtype="int32", seed=generator)
    return ops.cast(2 * signs - 1, "float32")


def hash_parameters_shape(dim, num_hashes, hash_code_len, method=_validation.DEFAULT_HASH_METHOD):
    """The shape of `hash_parameters(dim, num_hashes, hash_code_len, seed, method)`: `(dim, m * tau)` for
    "gaussian", `(num_blocks, 3, padded_dim)` for the Hadamard methods (`hadamard_blocks`)."""
    if method == "gaussian":
        return (dim, num_hashes * hash_code_len)
    blocks, padded = hadamard_blocks(dim, num_hashes, hash_code_len, method)
    return (blocks, 3, padded)


def _given_parameters(parameters, dim, num_hashes, hash_code_len, method):
    """`parameters` as float32, or ValueError when their shape is not that of `hash_parameters`."""
    expected = hash_parameters_shape(dim, num_hashes, hash_code_len, method)
    got = _backend.static_shape(parameters)
    if got is None or tuple(got) != expected:
        raise ValueError(f"parameters of the {method!r} hash of {dim}-dim vectors with num_hashes={num_hashes} and "
                         f"hash_code_len={hash_code_len} must have shape {expected} (as hash_parameters gives them), "
                         f"got shape {None if got is None else tuple(got)}")
    return ops.cast(parameters, "float32")


def hash_codes(x, num_hashes, hash_code_len, seed=None, method=_validation.DEFAULT_HASH_METHOD, implementation="auto",
               parameters=None):
    """Hyperplane (sign random projection) LSH codes of `x` (YOSO §3.2, appendix §1.2).

    Args:
      x: `[B, N, d]` float tensor (unit-norm rows for YOSO; any rows work).
      num_hashes: m >= 1, the number of independent hashes.
      hash_code_len: tau in [1, 30], sign bits per hash.
      seed: int or `[2]` int tensor (see `hash_parameters`). The same seed gives the same hash
        functions, so codes of queries and keys hashed with one seed collide with probability
        (1 - theta/pi)^tau for vectors at angle theta (YOSO eq. 1; the kernel of eq. 2). None
        when `parameters` are given.
      method: how the m tau hyperplanes are drawn.
        - "hadamard_interleaved" (default): blocks of H D3 H D2 H D1 (H the Walsh-Hadamard
          matrix, D random sign diagonals, x zero-padded to a power-of-two width, so any d
          works; appendix §1.2), bit k of the codes taken from block k mod num_blocks with at
          least tau blocks, so the tau bits of a hash are signs under independent rotations and
          collide with probability (1 - theta/pi)^tau within sampling noise for every d >= 8
          and tau <= 16 (tests/test_hash_statistics.py). O(N max(m, d) tau log d) in the custom op.
        - "hadamard": the same blocks, a hash's bits from neighbouring rows of one block
          (the default before 2026-11, kept for layers saved with it). Orthogonal rows make the
          bits dependent: at d = 16, tau = 8 the collision rate at theta = 1.5 is 0.4x the
          formula (0.83x at d = 64). O(N m tau log d).
        - "gaussian": a dense N(0, 1) projection, exact, O(N m tau d).
        The composite computes each as one projection matmul, O(N m tau d).
      implementation: "auto", "custom_op" or "composite".
      parameters: the hash functions themselves instead of a seed: the float32 tensor
        `hash_parameters(d, num_hashes, hash_code_len, seed, method)` returns (a layer keeps its
        inference hash functions as a weight, so they are saved with the weights). Give exactly
        one of `seed` and `parameters`.

    Returns:
      int32 `[B, num_hashes, N]`, code = sum_i [<x, r_{h,i}> > 0] 2^i, in [0, 2^tau). A NaN
      row hashes to code 0 in every hash.
    """
    num_hashes = _validation.integer(num_hashes, "num_hashes", 1)
    hash_code_len = _validation.hash_code_len(hash_code_len, cumulation=False)
    method = _validation.choice(method, "method", _validation.HASH_METHODS)
    if (seed is None) == (parameters is None):
        raise ValueError("hash_codes takes exactly one of `seed` (the hash functions are drawn from it) and "
                         f"`parameters` (the hash functions themselves); got seed={seed!r} and parameters="
                         f"{'None' if parameters is None else 'a tensor'}")
    if seed is not None and not _validation.is_integer(seed):
        _seed_tensor(seed)
    x = _validation.float_tensor(x, "x", 3)
    provider = _dispatch.provider(implementation, (x,), _spec.BIDIRECTIONAL, (_spec.hash_primitive(method).name,))
    dim = _backend.static_shape(x)[2]
    if dim is None:
        raise ValueError(f"the last dimension of x must be known statically, got shape {_backend.static_shape(x)}")
    if dim == 0:
        raise ValueError(f"x must have at least one feature (axis 2), got shape {_backend.static_shape(x)}")
    if parameters is None:
        params = _parameters(dim, num_hashes, hash_code_len, seed, method)
    else:
        params = _given_parameters(parameters, dim, num_hashes, hash_code_len, method)
    # Per position: on a mesh each device hashes its own block with the same (replicated) functions.
    primitive = _spec.hash_primitive(method)
    return _dispatch.on_mesh(provider, lambda p, x, params: p.run(primitive.name, x, params, num_hashes, hash_code_len),
                             (x, params), [t.roles for t in primitive.inputs], _spec.CODES_ROLES, pointwise=True)
