"""YOSO ops: LSH hashing, cumulation (hash scatter/gather) and the backward estimators.

Every function takes `implementation="auto" | "custom_op" | "composite"`:
"custom_op" runs the compiled C++/CUDA kernels, "composite" the pure-TF ops of
`keras_yoso.ops.composite` (same numbers to float32 rounding; XLA- and
serving-friendly), "auto" picks the custom op when the library is loaded, the
graph is not being compiled with XLA, and not (op determinism enabled and a GPU
visible: the GPU cumulations use float atomics), else the composite.

`B` is any flattened batch (batch x heads). Codes are int32 `[B, m, N]`. Masks
are `[B, N]`, bool or 0/1 float (any nonzero keeps the position). float16,
bfloat16 and float32 inputs are accumulated in float32; outputs keep the input
dtype. Paper: Zeng et al., "You Only Sample (Almost) Once", ICML 2021.
"""

import math
import numbers

import tensorflow as tf
from tensorflow.python.framework import config as tf_config
from tensorflow.python.ops import control_flow_util

from keras_yoso.ops import _library
from keras_yoso.ops import composite

IMPLEMENTATIONS = ("auto", "custom_op", "composite")
HASH_METHODS = ("gaussian", "hadamard")
BACKWARDS = ("lower_bound", "collision")
EXPECTATION_BACKWARDS = ("lower_bound", "exact")
MAX_NUM_BUCKETS = 2 ** 20
MAX_HASH_CODE_LEN = 30
# epsilon in the *YOSO pair weight tau p^(tau-1) / (pi sqrt(1 - x^2 + epsilon)) (appendix eq. 2).
COLLISION_EPSILON = 1e-6
_FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


# ----------------------------------------------------------------------------
# Argument checking shared by the public functions.

def _resolve(implementation):
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "custom_op":
        if not _library.custom_ops_available():
            raise RuntimeError("implementation='custom_op' but the keras_yoso op library is not loaded: "
                               f"{_library.load_error()}")
        return "custom_op"
    if implementation == "auto":
        usable = _library.custom_ops_available() and not _in_xla_context() and not _gpu_needs_determinism()
        return "custom_op" if usable else "composite"
    return "composite"


def _gpu_needs_determinism():
    """True under `enable_op_determinism()` with a GPU visible, where the custom GPU cumulations
    (float atomics) would raise UnimplementedError: "auto" then takes the deterministic composite."""
    return tf_config.is_op_determinism_enabled() and bool(tf.config.list_physical_devices("GPU"))


def _in_xla_context():
    """True while tracing a graph that XLA will compile (`jit_compile=True`)."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _check_int(value, name, low, high=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low or (
            high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def _check_num_buckets(num_buckets):
    num_buckets = _check_int(num_buckets, "num_buckets", 1, MAX_NUM_BUCKETS)
    if num_buckets & (num_buckets - 1):
        raise ValueError(f"num_buckets must be a power of two in [1, 2**20], got {num_buckets}")
    return num_buckets


def _with_rank(x, rank, name, expected):
    """x with static rank `rank`: ValueError for a wrong known rank. An unknown rank (possible in
    a `tf.function`) is checked when the graph runs by tf.ensure_shape (InvalidArgumentError
    "Shape of tensor <graph name> [...] is not compatible with expected shape [?,?,?]"), a data
    dependency that graph optimizations keep ordered before every use of x."""
    if x.shape.rank is None:
        return tf.ensure_shape(x, [None] * rank)
    if x.shape.rank != rank:
        raise ValueError(f"{name} must have {expected}, got shape {x.shape}")
    return x


def _float_tensor(x, name, rank):
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype.name}")
    if x.dtype == tf.float64:
        x = tf.cast(x, tf.float32)
    return _with_rank(x, rank, name, f"rank {rank}")


def _codes_message(name, num_buckets):
    return f"{name} must hold codes in [0, num_buckets) = [0, {num_buckets})"


def _codes_tensor(codes, name, num_buckets):
    """int32 [B, m, N] codes. Codes of an integer type wider than int32 are range-checked before
    the cast, so 2**32 + 3 cannot wrap around to the valid code 3."""
    codes = tf.convert_to_tensor(codes)
    if not codes.dtype.is_integer:
        raise TypeError(f"{name} must be an integer tensor of hash codes, got dtype {codes.dtype.name}")
    codes = _with_rank(codes, 3, name, "shape [batch, num_hashes, length]")
    if codes.dtype in (tf.int64, tf.uint32, tf.uint64):
        message = _codes_message(name, num_buckets)
        checks = [tf.debugging.assert_less(codes, tf.constant(num_buckets, codes.dtype), message=message)]
        if codes.dtype == tf.int64:
            checks.append(tf.debugging.assert_non_negative(codes, message=message))
        with tf.control_dependencies(checks):
            codes = tf.identity(codes)
    return tf.cast(codes, tf.int32)


def _mask_tensor(mask, batch, length, name):
    """[B, N] float 0/1 mask from None, bool or numeric input (nonzero keeps, NaN included)."""
    if mask is None:
        return tf.ones(tf.stack([batch, length]), tf.float32)
    mask = tf.convert_to_tensor(mask)
    if not (mask.dtype == tf.bool or mask.dtype.is_integer or mask.dtype.is_floating):
        raise TypeError(f"{name} must be a bool or numeric tensor, got dtype {mask.dtype.name}")
    mask = _with_rank(mask, 2, name, "shape [batch, length]")
    if mask.dtype != tf.bool:
        mask = tf.not_equal(mask, tf.zeros([], mask.dtype))
    return tf.cast(mask, tf.float32)


def _check_same(dims, what):
    """Static check that every known dim in dims [(label, dim)] agrees (ValueError otherwise)."""
    known = [(name, dim) for name, dim in dims if dim is not None]
    if len({dim for _, dim in known}) > 1:
        listed = ", ".join(f"{name}={dim}" for name, dim in known)
        raise ValueError(f"{what} must agree: {listed}")


def _dims_agree(entries, what):
    """Checks that the dims of entries [(label, tensor, axis)] are all equal.

    Known dims are compared now (ValueError "<what> must agree: label=dim, ..."). Each unknown
    dim (a `tf.function` with None in its input signature) becomes a run-time assertion with the
    same text (InvalidArgumentError). Returns the assertions: none in eager mode.
    """
    dims = [t.shape[axis] for _, t, axis in entries]
    _check_same([(label, dim) for (label, _, _), dim in zip(entries, dims)], what)
    if all(dim is not None for dim in dims):
        return []
    ref = next((k for k, dim in enumerate(dims) if dim is not None), 0)
    ref_label, ref_tensor, ref_axis = entries[ref]
    ref_dim = dims[ref] if dims[ref] is not None else tf.shape(ref_tensor)[ref_axis]
    return [tf.debugging.assert_equal(tf.shape(t)[axis], ref_dim,
                                      message=f"{what} must agree: {label} differs from {ref_label}")
            for k, ((label, t, axis), dim) in enumerate(zip(entries, dims)) if k != ref and dim is None]


def _after(checks, tensors):
    """`tensors`, made to depend on the run-time `checks` (unchanged when there are none)."""
    if not checks:
        return tensors
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


def _validated_codes(codes, num_buckets, name, implementation):
    """Composite path: codes outside [0, num_buckets) raise InvalidArgumentError, as in the custom op's kernel."""
    if implementation != "composite":
        return codes
    message = _codes_message(name, num_buckets)
    checks = [tf.debugging.assert_non_negative(codes, message=message),
              tf.debugging.assert_less(codes, tf.constant(num_buckets, codes.dtype), message=message)]
    with tf.control_dependencies(checks):
        return tf.identity(codes)


# ----------------------------------------------------------------------------
# Hashing.

def _seed_tensor(seed):
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return tf.constant([int(seed) & 0x7FFFFFFF, (int(seed) >> 31) & 0x7FFFFFFF], tf.int64)
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer or (seed.shape.rank is not None and seed.shape != [2]):
        raise ValueError(f"seed must be an int or an integer tensor of shape [2], got {seed!r}")
    return tf.cast(seed, tf.int64)


def _next_power_of_two(n):
    return 1 if n <= 1 else 2 ** math.ceil(math.log2(n))


def hash_parameters(dim, num_hashes, hash_code_len, seed, method="gaussian"):
    """The random hash functions that `hash_codes` draws from `seed`.

    Returns the Gaussian projection [dim, num_hashes * hash_code_len] or, for
    method="hadamard", the diagonal signs [num_blocks, 3, padded_dim] (+-1) with
    padded_dim the next power of two >= dim and num_blocks = ceil(m tau / padded_dim).
    """
    seed = _seed_tensor(seed)
    bits = num_hashes * hash_code_len
    if method == "gaussian":
        return tf.random.stateless_normal([dim, bits], seed, dtype=tf.float32)
    padded = _next_power_of_two(dim)
    blocks = -(-bits // padded)
    signs = tf.random.stateless_uniform([blocks, 3, padded], seed, minval=0, maxval=2, dtype=tf.int32)
    return tf.cast(2 * signs - 1, tf.float32)


def hash_codes(x, num_hashes, hash_code_len, seed, method="gaussian", implementation="auto"):
    """Hyperplane (sign random projection) LSH codes of `x` (YOSO §3.2, appendix §1.2).

    Args:
      x: `[B, N, d]` float tensor (unit-norm rows for YOSO; any rows work).
      num_hashes: m >= 1, the number of independent hashes.
      hash_code_len: tau in [1, 30], sign bits per hash.
      seed: int or `[2]` int tensor. The same seed gives the same hash
        functions, so codes of queries and keys hashed with one seed collide
        with probability (1 - theta/pi)^tau for vectors at angle theta
        (exactly for "gaussian", approximately for "hadamard").
      method: "gaussian" (dense N(0, 1) projection, O(N m tau d)) or "hadamard"
        (H D3 H D2 H D1 with random sign diagonals, O(N m tau log d); x is
        zero-padded to a power-of-two width, so any d works).
      implementation: "auto", "custom_op" or "composite".

    Returns:
      int32 `[B, num_hashes, N]`, code = sum_i [<x, r_{h,i}> > 0] 2^i, in [0, 2^tau).
    """
    num_hashes = _check_int(num_hashes, "num_hashes", 1)
    hash_code_len = _check_int(hash_code_len, "hash_code_len", 1, MAX_HASH_CODE_LEN)
    _check_choice(method, "method", HASH_METHODS)
    impl = _resolve(implementation)
    x = _float_tensor(x, "x", 3)
    dim = x.shape[-1]
    if dim is None:
        raise ValueError(f"the last dimension of x must be known statically, got shape {x.shape}")
    if dim < 1:
        raise ValueError(f"x must have at least one feature (axis 2), got shape {x.shape}")
    params = hash_parameters(dim, num_hashes, hash_code_len, seed, method)
    if impl == "custom_op":
        op = (_library.library().yoso_gaussian_hash_codes if method == "gaussian"
              else _library.library().yoso_hadamard_hash_codes)
        return op(x, params, num_hashes=num_hashes, hash_code_len=hash_code_len)
    fn = composite.gaussian_hash_codes if method == "gaussian" else composite.hadamard_hash_codes
    return fn(x, params, num_hashes, hash_code_len)


# ----------------------------------------------------------------------------
# Cumulations.

def _lsh(qm, qc, km, kc, value, num_buckets, impl):
    if impl == "custom_op":
        return _library.library().yoso_lsh_cumulation(qm, qc, km, kc, value, num_buckets=num_buckets)
    return composite.lsh_cumulation(qm, qc, km, kc, value, num_buckets)


def _weighted(qm, qc, qw, km, kc, kw, value, num_buckets, impl):
    if impl == "custom_op":
        return _library.library().yoso_weighted_lsh_cumulation(qm, qc, qw, km, kc, kw, value,
                                                               num_buckets=num_buckets)
    return composite.weighted_lsh_cumulation(qm, qc, qw, km, kc, kw, value, num_buckets)


def _weighted_in_blocks(qm, qc, qw, km, kc, kw, value, num_buckets, impl):
    """`_weighted`, split into blocks of weight and value columns when its bucket table would
    exceed composite.MAX_BUCKET_TABLE_FLOATS (and the widths are static): the cumulation is a sum
    over weight columns and is computed column by column over value columns."""
    width, value_dim = qw.shape[2], value.shape[2]
    limit = composite.MAX_BUCKET_TABLE_FLOATS
    if width is None or value_dim is None or num_buckets * width * value_dim <= limit:
        return _weighted(qm, qc, qw, km, kc, kw, value, num_buckets, impl)
    weight_block = min(width, limit // num_buckets)
    value_block = min(value_dim, limit // (num_buckets * weight_block))
    columns = []
    for c0 in range(0, value_dim, value_block):
        v = value[:, :, c0:c0 + value_block]
        columns.append(tf.add_n([_weighted(qm, qc, qw[:, :, w0:w0 + weight_block], km, kc,
                                           kw[:, :, w0:w0 + weight_block], v, num_buckets, impl)
                                 for w0 in range(0, width, weight_block)]))
    return tf.concat(columns, axis=-1)


def _collision(qm, qc, q, qw, km, kc, k, kw, hash_code_len, impl):
    if impl == "custom_op":
        return _library.library().yoso_collision_cumulation(
            qm, qc, q, qw, km, kc, k, kw, hash_code_len=hash_code_len, epsilon=COLLISION_EPSILON)
    return composite.collision_cumulation(qm, qc, q, qw, km, kc, k, kw, hash_code_len, COLLISION_EPSILON)


def _prepare_sides(query_codes, key_codes, query_mask, key_mask, query_side, key_side, num_buckets, impl,
                   widths=()):
    """Converts and checks the codes and masks of both sides and the per-position tensors.

    query_side / key_side: [(name, tensor [B, N, *])] of each side; widths: extra
    [(entries, what)] groups of `_dims_agree`. Shapes known while the graph is built are checked
    now (ValueError); unknown ones when it runs (InvalidArgumentError, same messages).

    Returns (query_mask, query_codes, key_mask, key_codes, query tensors, key tensors), all made
    to depend on the run-time checks.
    """
    qc = _codes_tensor(query_codes, "query_codes", num_buckets)
    kc = _codes_tensor(key_codes, "key_codes", num_buckets)
    checks = _dims_agree([("query_codes", qc, 1), ("key_codes", kc, 1)], "num_hashes (axis 1 of the codes)")
    if qc.shape[1] == 0:
        raise ValueError(f"query_codes must have num_hashes >= 1 (axis 1), got shape {qc.shape}")
    if qc.shape[1] is None:
        checks.append(tf.debugging.assert_positive(
            tf.shape(qc)[1], message="query_codes must have num_hashes >= 1 (axis 1)"))
    named = {"query_codes": qc, "key_codes": kc}
    for side, codes, mask, per_position in (("query", qc, query_mask, query_side), ("key", kc, key_mask, key_side)):
        given = [] if mask is None else [(f"{side}_mask", _mask_tensor(mask, None, None, f"{side}_mask"))]
        named.update(given)
        checks += _dims_agree([(f"{side}_codes", codes, 0)] + [(name, t, 0) for name, t in given + per_position],
                              f"batch sizes (axis 0) of the {side} inputs")
        checks += _dims_agree([(f"{side}_codes axis 2", codes, 2)]
                              + [(f"{name} axis 1", t, 1) for name, t in given + per_position], f"{side} lengths")
    checks += _dims_agree([("query_codes", qc, 0), ("key_codes", kc, 0)], "batch sizes (axis 0) of queries and keys")
    for entries, what in widths:
        checks += _dims_agree(entries, what)
    named.update(query_side)
    named.update(key_side)
    named = dict(zip(named, _after(checks, list(named.values()))))
    qc, kc = named["query_codes"], named["key_codes"]
    qm = named.get("query_mask")
    km = named.get("key_mask")
    qm = _mask_tensor(None, tf.shape(qc)[0], tf.shape(qc)[2], "query_mask") if qm is None else qm
    km = _mask_tensor(None, tf.shape(kc)[0], tf.shape(kc)[2], "key_mask") if km is None else km
    qc = _validated_codes(qc, num_buckets, "query_codes", impl)
    kc = _validated_codes(kc, num_buckets, "key_codes", impl)
    return qm, qc, km, kc, [named[name] for name, _ in query_side], [named[name] for name, _ in key_side]


def lsh_cumulation(query_codes, key_codes, value, num_buckets, query_mask=None, key_mask=None,
                   implementation="auto"):
    """LSH cumulation: YOSO's Bernoulli-sampled attention, eq. 2 averaged over m hashes (§3.2).

    out[b, i] = qmask[b, i] (1/m) sum_h sum_j kmask[b, j] [qc[b,h,i] == kc[b,h,j]] value[b, j]

    computed by scattering values into `num_buckets` buckets per hash and
    gathering by query code: O(B m (Nq + Nk) D) time, no O(N^2) term.

    Args:
      query_codes: int `[B, m, Nq]`; key_codes: int `[B, m, Nk]`, in [0, num_buckets).
      value: float `[B, Nk, D]`.
      num_buckets: a power of two <= 2**20 (2**hash_code_len).
      query_mask: `[B, Nq]` or None; masked queries output 0.
      key_mask: `[B, Nk]` or None; masked keys never contribute (NaN in them included).
      implementation: "auto", "custom_op" or "composite".

    Returns:
      `[B, Nq, D]` in value's dtype. Differentiable in `value`.
    """
    num_buckets = _check_num_buckets(num_buckets)
    impl = _resolve(implementation)
    value = _float_tensor(value, "value", 3)
    qm, qc, km, kc, _, (value,) = _prepare_sides(query_codes, key_codes, query_mask, key_mask, [],
                                                 [("value", value)], num_buckets, impl)
    return _lsh(qm, qc, km, kc, value, num_buckets, impl)


def weighted_lsh_cumulation(query_codes, query_weight, key_codes, key_weight, value, num_buckets,
                            query_mask=None, key_mask=None, implementation="auto"):
    """LSH cumulation with each colliding pair weighted by <query_weight[b,i], key_weight[b,j]>.

    out[b, i] = qmask (1/m) sum_h sum_j kmask [qc == kc] <qw[b,i], kw[b,j]> value[b, j]

    The building block of the lower-bound backward (paper eq. 4): buckets hold
    outer products key_weight (x) value, O(B m (Nq + Nk) W D) time.

    Args:
      query_codes `[B, m, Nq]`, query_weight `[B, Nq, W]`, key_codes `[B, m, Nk]`,
      key_weight `[B, Nk, W]`, value `[B, Nk, D]`, num_buckets, masks and
      implementation as in `lsh_cumulation`.

    The bucket table, num_buckets * W * D floats, may hold at most 2**28 (1 GiB): a larger one
    raises ValueError (InvalidArgumentError when W or D is only known at run time).

    Returns:
      `[B, Nq, D]`. Differentiable in query_weight, key_weight and value.
    """
    num_buckets = _check_num_buckets(num_buckets)
    impl = _resolve(implementation)
    query_weight = _float_tensor(query_weight, "query_weight", 3)
    key_weight = _float_tensor(key_weight, "key_weight", 3)
    value = _float_tensor(value, "value", 3)
    widths = [([("query_weight", query_weight, 2), ("key_weight", key_weight, 2)],
               "weight widths (axis 2 of query_weight and key_weight)")]
    qm, qc, km, kc, (query_weight,), (key_weight, value) = _prepare_sides(
        query_codes, key_codes, query_mask, key_mask, [("query_weight", query_weight)],
        [("key_weight", key_weight), ("value", value)], num_buckets, impl, widths)
    composite.check_bucket_table(num_buckets, query_weight.shape[2], value.shape[2])
    query_weight, key_weight = tf.cast(query_weight, value.dtype), tf.cast(key_weight, value.dtype)
    return _weighted(qm, qc, query_weight, km, kc, key_weight, value, num_buckets, impl)


def yoso_cumulation(query, key, value, query_codes, key_codes, hash_code_len, query_mask=None,
                    key_mask=None, backward="lower_bound", implementation="auto"):
    """YOSO attention Y = B(Q, K) V with a gradient from the paper's estimators.

    Forward equals `lsh_cumulation(query_codes, key_codes, value, 2**hash_code_len, masks)`
    (eq. 2). The gradient reuses the forward's codes; c_ij = number of hashes in
    which query i and key j collide:

    - backward="lower_bound" (eq. 4): dV_j = (1/m) sum_i c_ij dY_i,
      dQ_i = (tau/2)(1/m) sum_j c_ij <dY_i, V_j> K_j, dK_j = (tau/2)(1/m) sum_i c_ij <dY_i, V_j> Q_i.
      O(B m N d D) time via `weighted_lsh_cumulation`.
    - backward="collision" (*YOSO, appendix eq. 2 restricted to colliding pairs):
      over pairs colliding in >= 1 hash, w_ij = <dY_i, V_j> tau (1 - acos(x)/pi)^(tau-1)
      / (pi sqrt(1 - x^2 + eps)), x = <Q_i, K_j> clipped to [-1, 1], eps = 1e-6;
      dQ_i = sum_j w_ij K_j, dK_j = sum_i w_ij Q_i, dV as above. Cost
      O(nnz (m + d + D)) with nnz the number of colliding pairs (custom op; the
      composite is dense, O(N^2)).

    Args:
      query `[B, Nq, d]`, key `[B, Nk, d]`: expected unit-norm (not renormalized here).
      value `[B, Nk, D]`; query_codes `[B, m, Nq]`, key_codes `[B, m, Nk]` from
      `hash_codes(query/key, m, hash_code_len, same seed)`.
      hash_code_len: tau in [1, 20]; masks and implementation as in `lsh_cumulation`.

    Returns:
      `[B, Nq, D]` in value's dtype.
    """
    hash_code_len = _check_int(hash_code_len, "hash_code_len", 1, 20)
    _check_choice(backward, "backward", BACKWARDS)
    impl = _resolve(implementation)
    num_buckets = 2 ** hash_code_len
    value = _float_tensor(value, "value", 3)
    query = tf.cast(_float_tensor(query, "query", 3), value.dtype)
    key = tf.cast(_float_tensor(key, "key", 3), value.dtype)
    widths = [([("query", query, 2), ("key", key, 2)], "query and key widths (axis 2)")]
    qm, qc, km, kc, (query,), (key, value) = _prepare_sides(
        query_codes, key_codes, query_mask, key_mask, [("query", query)], [("key", key), ("value", value)],
        num_buckets, impl, widths)
    half_tau = tf.constant(hash_code_len / 2.0, value.dtype)

    @tf.custom_gradient
    def _attention(q, k, v):
        def grad(dy):
            dy = tf.cast(dy, v.dtype)
            if backward == "lower_bound":
                dq = half_tau * _weighted_in_blocks(qm, qc, dy, km, kc, v, k, num_buckets, impl)
                dk = half_tau * _weighted_in_blocks(km, kc, v, qm, qc, dy, q, num_buckets, impl)
            else:
                dq = _collision(qm, qc, q, dy, km, kc, k, v, hash_code_len, impl)
                dk = _collision(km, kc, k, v, qm, qc, q, dy, hash_code_len, impl)
            dv = _lsh(km, kc, qm, qc, dy, num_buckets, impl)
            return dq, dk, dv

        return _lsh(qm, qc, km, kc, v, num_buckets, impl), grad

    return _attention(query, key, value)


def _dense_inputs(query, key, value, query_mask, key_mask):
    """Checks the inputs of the YOSO-E functions against each other (value may be None).

    Returns (query, key, value, query_mask, key_mask) as float tensors, masks [B, N] of 0/1,
    made to depend on the run-time checks of the dims unknown while the graph is built.
    """
    query = _float_tensor(query, "query", 3)
    key = _float_tensor(key, "key", 3)
    values = [] if value is None else [("value", _float_tensor(value, "value", 3))]
    masks = [(name, _mask_tensor(mask, None, None, name))
             for name, mask in (("query_mask", query_mask), ("key_mask", key_mask)) if mask is not None]
    named = dict([("query", query), ("key", key)] + values + masks)
    checks = _dims_agree([("query", query, 2), ("key", key, 2)], "query and key widths (axis 2)")
    checks += _dims_agree([(name, t, 0) for name, t in named.items()], "batch sizes (axis 0)")
    checks += _dims_agree([(f"{name} axis 1", named[name], 1) for name in ("query", "query_mask") if name in named],
                          "query lengths")
    checks += _dims_agree([(f"{name} axis 1", named[name], 1) for name in ("key", "value", "key_mask")
                           if name in named], "key lengths")
    named = dict(zip(named, _after(checks, list(named.values()))))
    query, key = named["query"], named["key"]
    qm = named.get("query_mask")
    km = named.get("key_mask")
    qm = _mask_tensor(None, tf.shape(query)[0], tf.shape(query)[1], "query_mask") if qm is None else qm
    km = _mask_tensor(None, tf.shape(key)[0], tf.shape(key)[1], "key_mask") if km is None else km
    return query, key, named.get("value"), qm, km


def yoso_expectation(query, key, value, hash_code_len, query_mask=None, key_mask=None,
                     backward="lower_bound", implementation="auto"):
    """YOSO-E: the expectation of YOSO over hash functions, E V (§3.1), in O(N^2).

    E_ij = (1 - acos(<Q_i, K_j>)/pi)^tau, the cosine clipped to [-1, 1] (no NaN at +-1);
    masked keys are dropped and masked queries output 0.

    backward="lower_bound": dQ = (tau/2)[(dY V^T) . E] K, dK = (tau/2)[(dY V^T) . E]^T Q
    (appendix eq. 3); backward="exact": the true derivative (appendix eq. 2),
    tau (1 - acos(x)/pi)^(tau-1) / (pi sqrt(1 - x^2 + eps)), eps = 1e-6 keeps it
    finite at x = +-1. dV = E^T dY for both. The computation is dense matmuls in
    every `implementation` (there is no faster kernel for an O(N^2) quantity).

    Returns `[B, Nq, D]` in value's dtype.
    """
    hash_code_len = _check_int(hash_code_len, "hash_code_len", 1, MAX_HASH_CODE_LEN)
    _check_choice(backward, "backward", EXPECTATION_BACKWARDS)
    _resolve(implementation)
    query, key, value, qm, km = _dense_inputs(query, key, value, query_mask, key_mask)
    dtype = value.dtype
    pair_mask = qm[:, :, None] * km[:, None, :]
    tau = float(hash_code_len)

    @tf.custom_gradient
    def _expectation(q, k, v):
        q32, k32 = tf.cast(q, tf.float32), composite._keep(km, tf.cast(k, tf.float32))
        v32 = composite._keep(km, tf.cast(v, tf.float32))
        x, e = composite.expectation_weights(q32, k32, tau, pair_mask)

        def grad(dy):
            dy32 = tf.cast(dy, tf.float32) * qm[:, :, None]
            dyv = tf.einsum("bid,bjd->bij", dy32, v32)
            if backward == "lower_bound":
                w = dyv * e * (tau / 2.0)
            else:
                w = dyv * composite.collision_derivative(x, tau, COLLISION_EPSILON) * pair_mask
            dq = tf.einsum("bij,bjd->bid", w, k32)
            dk = tf.einsum("bij,bid->bjd", w, q32)
            dv = tf.einsum("bij,bid->bjd", e, dy32)
            return tf.cast(dq, q.dtype), tf.cast(dk, k.dtype), tf.cast(dv, v.dtype)

        return tf.cast(tf.einsum("bij,bjd->bid", e, v32), dtype), grad

    return _expectation(query, key, value)


def yoso_expectation_weights(query, key, hash_code_len, query_mask=None, key_mask=None):
    """The YOSO-E attention matrix E_ij = (1 - acos(<Q_i, K_j>)/pi)^tau (§3.1), O(Nq Nk) memory.

    Cosines are clipped to [-1, 1]; entries of masked queries or keys are 0.
    query `[B, Nq, d]`, key `[B, Nk, d]` (unit rows), masks `[B, N]`.
    Returns float32 `[B, Nq, Nk]`; `yoso_expectation` computes E @ V with the same weights.
    """
    hash_code_len = _check_int(hash_code_len, "hash_code_len", 1, MAX_HASH_CODE_LEN)
    query, key, _, qm, km = _dense_inputs(query, key, None, query_mask, key_mask)
    key32 = composite._keep(km, tf.cast(key, tf.float32))
    return composite.expectation_weights(tf.cast(query, tf.float32), key32, hash_code_len,
                                         qm[:, :, None] * km[:, None, :])[1]


# ----------------------------------------------------------------------------
# Gradients of the raw custom ops (so tf.GradientTape works on them directly).

def _register_gradients():
    @tf.RegisterGradient("YosoLshCumulation")
    def _lsh_cumulation_grad(op, dy):
        qm, qc, km, kc, value = op.inputs
        dv = _library.library().yoso_lsh_cumulation(km, kc, qm, qc, tf.cast(dy, value.dtype),
                                                    num_buckets=op.get_attr("num_buckets"))
        return [None, None, None, None, dv]

    @tf.RegisterGradient("YosoWeightedLshCumulation")
    def _weighted_lsh_cumulation_grad(op, dy):
        qm, qc, qw, km, kc, kw, value = op.inputs
        nb = op.get_attr("num_buckets")
        run = _library.library().yoso_weighted_lsh_cumulation
        dy = tf.cast(dy, value.dtype)
        d_qw = run(qm, qc, dy, km, kc, value, kw, num_buckets=nb)
        d_kw = run(km, kc, value, qm, qc, dy, qw, num_buckets=nb)
        d_value = run(km, kc, kw, qm, qc, qw, dy, num_buckets=nb)
        return [None, None, d_qw, None, None, d_kw, d_value]

    for name in ("YosoGaussianHashCodes", "YosoHadamardHashCodes", "YosoCollisionCumulation"):
        tf.no_gradient(name)


if _library.custom_ops_available():
    _register_gradients()
