"""The one home of keras-yoso's argument checks, limits and defaults.

Every limit and default is defined here once; `keras_yoso.ops` and `keras_yoso.layers` read it
from here. The kernel-side twins of the limits live in custom_ops/cc/kernels/yoso_common.h, and
the kernels' messages built from them in custom_ops/cc/kernels/yoso_checks.h;
`tests/test_validation.py` checks that the constants are equal and that the messages of a limit
shared with the kernels (num_buckets, the per-bucket table) read the same on both sides.

Two message styles, one per kind of caller (both documented in docs/errors.md):

- ops (`keras_yoso.ops`): ``num_hashes must be an integer >= 1, got 0``;
- layers (Keras' wording): ``Received an invalid value for argument `num_heads`: expected a
  positive integer. Received: num_heads=0``.

Tensor checks (dtypes, ranks, dims that must agree, codes in range) are at the end: a check
whose dims are known runs now (ValueError / TypeError); one whose dims are unknown while a
TensorFlow graph is built becomes a run-time assertion with the same message
(`keras_yoso._backend`, the only module that knows the backends).
"""

import math
import numbers
import random

import keras
import numpy as np
from keras import ops

from keras_yoso import _backend

# --- limits (custom_ops/cc/kernels/yoso_common.h) ---------------------------------------------
# Codes are int32 and non-negative: at most 30 bits per hash (kMaxHashCodeLen).
MAX_HASH_CODE_LEN = 30
# Bucket tables hold at most 2**20 buckets (kMaxNumBuckets), so the cumulations, the YOSO
# attention built on them and the collision estimator take hash_code_len <= 20
# (kMaxCollisionHashCodeLen).
MAX_NUM_BUCKETS_LOG2 = 20
MAX_NUM_BUCKETS = 2 ** MAX_NUM_BUCKETS_LOG2
MAX_CUMULATION_HASH_CODE_LEN = MAX_NUM_BUCKETS_LOG2
# Largest per-bucket table of the weighted cumulation's custom op, W * D floats
# (kMaxBucketTableFloats: the CPU kernel's [W, D] K^T V table of one bucket, 1 GiB).
MAX_BUCKET_TABLE_FLOATS = 2 ** 28
# Largest decoding state an attention layer's `init_cache` allocates, in bytes (4 GiB): YOSO's bucket
# tables take 4 * batch * heads * num_hashes * 2**hash_code_len * value_dim bytes whatever the context
# length, 8 GiB at hash_code_len 20 for a single sequence of 4 heads of 16 values with 32 hashes. Larger
# states are refused (check_decoding_state) rather than allocated for a setting chosen for training.
MAX_DECODING_STATE_BYTES = 2 ** 32

# --- the tensor checks of the layers (keras_yoso._backend holds the backend-specific part) --------
# Shapes as Python tuples (None where unknown), and with the dims known only when a TensorFlow graph
# runs (for messages, joined by `text`); a run-time assertion for such dims; tensors made to depend on
# such assertions; whether they can run here.
static_shape = _backend.static_shape
run_time_shape = _backend.run_time_shape
text = _backend.text
run_time_check = _backend.check
after_checks = _backend.after
can_check = _backend.can_check

# --- choices and defaults ------------------------------------------------------------------------
IMPLEMENTATIONS = ("auto", "custom_op", "composite")
HASH_METHODS = ("gaussian", "hadamard", "hadamard_interleaved")
# The structured Hadamard projection with each bit of a hash from its own block: O(m tau log d)
# per vector in the kernels (O(tau d log d) when m < d), and its collision rate is
# (1 - theta/pi)^tau within sampling noise for every d >= 8 and tau in [1, 16]
# (tests/test_hash_statistics.py). "hadamard" (the default before 2026-11) falls short of it at
# wide angles and small d; it stays for the layers saved with it.
DEFAULT_HASH_METHOD = "hadamard_interleaved"
# YosoAttention's m hashes of tau bits each (docs/layer.md says when to change tau).
DEFAULT_NUM_HASHES = 32
DEFAULT_HASH_CODE_LEN = 6
# The backward estimators of sampled YOSO (yoso_cumulation: the lower bound of eq. 4, or the
# *YOSO collision estimator of appendix eq. 2) and of YOSO-E (yoso_expectation: eq. 4's lower
# bound on the expectation, or the exact derivative of the expectation).
SAMPLED_BACKWARDS = ("lower_bound", "collision")
EXPECTATION_BACKWARDS = ("lower_bound", "exact")
# epsilon of the *YOSO pair weight tau p^(tau-1) / (pi sqrt(1 - x^2 + epsilon)) (appendix eq. 2).
COLLISION_EPSILON = 1e-6
# epsilon added to the denominator of LinearRelativeAttention (Scaleformer eq. 10).
LINEAR_RELATIVE_EPSILON = 1e-6
# Rows per chunk of LinearRelativeAttention's causal prefix sums and relative band, when not given.
LINEAR_RELATIVE_CHUNK_SIZE = 64


def is_integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _layer_error(name, expected, value):
    return ValueError(f"Received an invalid value for argument `{name}`: expected {expected}. "
                      f"Received: {name}={value!r}")


def integer(value, name, low, high=None, *, allow_none=False, layer=False):
    """`value` as an int in [low, high] (None passes when `allow_none`); else ValueError naming `name`."""
    if value is None and allow_none:
        return None
    if is_integer(value) and value >= low and (high is None or value <= high):
        return int(value)
    if layer:
        expected = (f"an integer in [{low}, {high}]" if high is not None
                    else "a positive integer" if low == 1 else f"an integer >= {low}")
        raise _layer_error(name, expected + (" or None" if allow_none else ""), value)
    bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
    raise ValueError(f"{name} must be {'None or ' if allow_none else ''}an integer {bound}, got {value!r}")


def choice(value, name, choices, *, layer=False):
    """`value` if it is one of `choices`; else ValueError naming `name` and the choices."""
    if isinstance(value, str) and value in choices:
        return value
    if layer:
        raise _layer_error(name, f"one of {tuple(choices)}", value)
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def boolean(value, name, *, layer=False, allow_none=False):
    """`value` as a Python bool: a bool (NumPy bools included) or, as keras.layers.MultiHeadAttention
    takes its flags, the integer 0 or 1 (e.g. `use_causal_mask=0`); else ValueError naming `name`."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if is_integer(value) and int(value) in (0, 1):
        return bool(value)
    if layer:
        raise _layer_error(name, "None or a Python bool (or 0 / 1)" if allow_none else "a bool (or 0 / 1)", value)
    raise ValueError(f"{name} must be a bool (or 0 / 1), got {value!r}")


def positive_float(value, name, *, layer=False, why=""):
    """`value` as a finite float > 0; else ValueError naming `name` (`why`: a reason for the ops message)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and (
            0 < value < math.inf):
        return float(value)
    if layer:
        raise _layer_error(name, "a finite float > 0", value)
    raise ValueError(f"{name} must be a finite float > 0{why}, got {value!r}")


def fraction(value, name):
    """A float in [0, 1) (dropout rates); else ValueError in Keras' wording."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and 0.0 <= value < 1.0:
        return float(value)
    raise _layer_error(name, "a float in [0, 1)", value)


def optional_seed(value, name="seed"):
    """An int seed or None; else ValueError in Keras' wording."""
    if value is None or is_integer(value):
        return None if value is None else int(value)
    raise _layer_error(name, "an integer or None", value)


# Seeds drawn by `resolve_seed` lie in [1, SEED_MODULUS), and `derived_seed` wraps around modulo SEED_MODULUS.
SEED_MODULUS = 2 ** 31


def resolve_seed(value, name="seed"):
    """An int seed: `value`, or for None one drawn now. Layers call it at construction and keep the
    result in get_config, so a reloaded layer hashes (and drops out) as the original."""
    value = optional_seed(value, name)
    return random.randint(1, SEED_MODULUS - 1) if value is None else value


def derived_seed(seed, stream):
    """The seed of stream `stream` (an int >= 0) of the int `seed`: (seed + stream) mod SEED_MODULUS.

    One stored seed gives a layer's sublayers, or a model's layers, seeds of their own: a block's
    dropouts take streams 1 and 2 of the block's seed, `CausalLM` block i stream 7 i of the model's,
    `replace_attention` its i-th cloned layer stream i. Configs and checkpoints store only the seed
    they were derived from, so this formula is part of the saved format: changed, a reloaded model
    would draw other hash functions and dropout masks than it was trained with."""
    return (seed + stream) % SEED_MODULUS


def _power_text(value):
    """"2**k" for a power of two 2**k >= 2**8, else the number (PowerText of yoso_checks.h)."""
    k = value.bit_length() - 1
    return f"2**{k}" if value == 1 << k and k >= 8 else str(value)


def num_buckets(value):
    """A power of two in [1, MAX_NUM_BUCKETS]."""
    value = integer(value, "num_buckets", 1, MAX_NUM_BUCKETS)
    if value & (value - 1):
        raise ValueError(f"num_buckets must be a power of two in [1, {_power_text(MAX_NUM_BUCKETS)}], got {value}")
    return value


def hash_code_len(value, *, cumulation, layer=False):
    """tau in [1, MAX_CUMULATION_HASH_CODE_LEN] for anything that fills bucket tables
    (`cumulation=True`), else [1, MAX_HASH_CODE_LEN] (codes only)."""
    high = MAX_CUMULATION_HASH_CODE_LEN if cumulation else MAX_HASH_CODE_LEN
    return integer(value, "hash_code_len", 1, high, layer=layer)


def output_shape(value):
    """None, or a non-empty tuple of positive ints (a single int is a 1-tuple)."""
    if value is None:
        return None
    shape = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not shape or not all(is_integer(d) and d > 0 for d in shape):
        # MultiHeadAttention's words first ("Invalid `output_shape`"), so code that matches them still does.
        raise ValueError("Invalid `output_shape`: received an invalid value for argument `output_shape`: expected a "
                         f"positive int or a non-empty tuple of positive ints. Received: output_shape={value!r}")
    return tuple(int(d) for d in shape)


def bucket_table_message(weight_dim, value_dim, limit=MAX_BUCKET_TABLE_FLOATS):
    """The error text of a per-bucket table over `limit` floats (MAX_BUCKET_TABLE_FLOATS: CheckBucketTable
    of yoso_checks.h)."""
    gib = limit * 4 / 2 ** 30  # float32 entries
    return (f"the per-bucket table of the weighted LSH cumulation, weight_dim * value_dim = {weight_dim} * "
            f"{value_dim} floats (weight_dim: axis 2 of query_weight and key_weight; value_dim: axis 2 of value), "
            f"exceeds the limit of {_power_text(limit)} floats ({gib:g} GiB); split weight_dim "
            f"or value_dim into chunks")


def check_bucket_table(weight_dim, value_dim, limit=MAX_BUCKET_TABLE_FLOATS):
    """ValueError when the known widths make a provider's per-bucket table W * D exceed `limit` floats
    (the native kernels': MAX_BUCKET_TABLE_FLOATS)."""
    if weight_dim is not None and value_dim is not None and weight_dim * value_dim > limit:
        raise ValueError(bucket_table_message(weight_dim, value_dim, limit))


def check_decoding_state(size, what, fix):
    """ValueError when a decoding state of `size` bytes (`what`: which one and how it is sized) exceeds
    MAX_DECODING_STATE_BYTES; `fix` says which arguments make it smaller."""
    if size > MAX_DECODING_STATE_BYTES:
        raise ValueError(f"{what} would allocate {size:,} bytes ({size / 2 ** 30:.1f} GiB), above the limit of "
                         f"{_power_text(MAX_DECODING_STATE_BYTES)} bytes ({MAX_DECODING_STATE_BYTES / 2 ** 30:g} GiB, "
                         f"keras_yoso._validation.MAX_DECODING_STATE_BYTES): {fix}")


def dims_agree(dims, what):
    """ValueError unless the known dims in `dims` [(label, dim or None)] are all equal."""
    known = [(name, dim) for name, dim in dims if dim is not None]
    if len({dim for _, dim in known}) > 1:
        listed = ", ".join(f"{name}={dim}" for name, dim in known)
        raise ValueError(f"{what} must agree: {listed}")


def codes_message(name, bucket_count):
    """The message of codes outside [0, bucket_count) (bucket_count: the num_buckets the codes index)."""
    return f"{name} must hold codes in [0, num_buckets) = [0, {bucket_count})"


# --- tensors --------------------------------------------------------------------------------------

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_WIDE_INT_DTYPES = ("int64", "uint32", "uint64")


def dtype_name(x):
    """The standardized dtype name of a tensor or array-like ("float32", "bool", "string", ...)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        dtype = np.asarray(x).dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "USO":
        return "string"
    try:
        return keras.backend.standardize_dtype(dtype)
    except (TypeError, ValueError):
        return str(getattr(dtype, "name", dtype))


def _with_rank(x, rank, name, expected):
    shape = _backend.static_shape(x)
    if shape is None:
        return _backend.ensure_rank(x, rank)
    if len(shape) != rank:
        raise ValueError(f"{name} must have {expected}, got shape {tuple(shape)}")
    return x


def float_tensor(x, name, rank):
    """`x` as a float tensor of rank `rank` (float64 computed in float32); TypeError / ValueError naming `name`."""
    dtype = dtype_name(x)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {dtype}")
    if dtype == "float64":
        x = ops.cast(x, "float32")
    return _with_rank(ops.convert_to_tensor(x), rank, name, f"rank {rank}")


def codes_tensor(codes, name, bucket_count):
    """int32 `[B, m, N]` codes. Codes of an integer type wider than int32 are range-checked before
    the cast, so 2**32 + 3 cannot wrap around to the valid code 3."""
    dtype = dtype_name(codes)
    if not dtype.startswith(("int", "uint")):
        raise TypeError(f"{name} must be an integer tensor of hash codes, got dtype {dtype}")
    if dtype in _WIDE_INT_DTYPES and isinstance(codes, (np.ndarray, list, tuple)):
        # Checked on the host first: JAX without x64 would wrap int64 to int32 on conversion.
        host = np.asarray(codes)
        if host.size and (host.min() < 0 or host.max() >= bucket_count):
            raise _backend.data_error(codes_message(name, bucket_count))
    codes = _with_rank(ops.convert_to_tensor(codes), 3, name, "shape [batch, num_hashes, length]")
    if dtype in _WIDE_INT_DTYPES:
        checks = codes_in_range(codes, bucket_count, name)
        (codes,) = _backend.after(checks, [codes])
    return ops.cast(codes, "int32")


def codes_in_range(codes, bucket_count, name):
    """Checks 0 <= codes < num_buckets: raises now when the codes are known, else returns the
    TensorFlow run-time assertions. Traced JAX code cannot raise: there, out-of-range codes are
    dropped by the composite like masked positions (docs/errors.md)."""
    if not _backend.can_check(codes) or _backend.static_shape(codes) is not None and 0 in _backend.static_shape(codes):
        return []
    return _backend.assert_in_range(codes, 0, bucket_count, codes_message(name, bucket_count))


def _is_numeric(dtype):
    return dtype == "bool" or dtype.startswith(("int", "uint", "float", "bfloat"))


def layer_input_dtype(x, name):
    """The dtype name of a layer's data input (`query`, `value`, `key`) when it is numeric; else (strings:
    a Python str, a NumPy array of str or bytes, a tf.string tensor) ValueError in Keras' wording naming
    `name`. Layers call it before Keras converts their arguments, where JAX and PyTorch would fail
    naming no argument."""
    dtype = dtype_name(x)
    if _is_numeric(dtype):
        return dtype
    raise ValueError(f"Received an invalid value for argument `{name}`: expected a floating-point tensor. "
                     f"Received: {name} of dtype {dtype}")


def _soft_mask_value(mask):
    """A value other than 0 and 1 (NaN included) of a float `mask` whose values are known now (eager
    tensors, NumPy arrays), else None. Graph tensors and traced arrays are not read: there any nonzero
    value keeps, as Keras' MultiHeadAttention reads masks. Costs one reduction."""
    if not dtype_name(mask).startswith(("float", "bfloat")) or not _backend.has_values(mask):
        return None
    with _backend.eagerly():  # a mask closed over by a traced function is read, not traced
        mask = ops.cast(mask, "float32")
        soft = ops.logical_and(ops.not_equal(mask, 0.0), ops.not_equal(mask, 1.0))
        if not bool(ops.convert_to_numpy(ops.any(soft))):
            return None
        return float(ops.convert_to_numpy(mask)[ops.convert_to_numpy(soft)][0])


def mask_dtype(mask, name, *, layer=False):
    """The dtype name of a mask when it is bool or numeric; else (strings) TypeError (ops) or, for
    layers, ValueError in Keras' wording, naming `name`. A float mask whose values are known now must
    hold only 0 and 1 (else ValueError naming `name` and a value: a mask is not a weight), also when a
    traced function closes over it; a traced mask's nonzero values all keep."""
    dtype = dtype_name(mask)
    if not _is_numeric(dtype):
        if layer:
            raise ValueError(f"Received an invalid value for argument `{name}`: expected a bool or numeric mask. "
                             f"Received: {name} of dtype {dtype}")
        raise TypeError(f"{name} must be a bool or numeric tensor, got dtype {dtype}")
    soft = _soft_mask_value(mask)
    if soft is not None:
        if layer:
            raise ValueError(f"Received an invalid value for argument `{name}`: expected a bool mask or a float "
                             f"mask of 0s and 1s (a mask keeps or drops positions; it is not a weight). "
                             f"Received: {name} holding {soft!r}")
        raise ValueError(f"{name} must be bool or hold only 0 and 1 (a mask keeps or drops positions; it is not a "
                         f"weight), got a value {soft!r}")
    return dtype


def mask_tensor(mask, name):
    """`[B, N]` bool mask from bool or numeric input (any nonzero keeps; a float mask of known values
    must hold only 0 and 1, `mask_dtype`)."""
    dtype = mask_dtype(mask, name)
    mask = _with_rank(ops.convert_to_tensor(mask), 2, name, "shape [batch, length]")
    return mask if dtype == "bool" else ops.not_equal(mask, ops.zeros((), mask.dtype))


def agree(entries, what):
    """Checks that the dims of entries [(label, tensor, axis)] are all equal: known dims now
    (ValueError "<what> must agree: label=dim, ..."), unknown ones when a TensorFlow graph runs
    (InvalidArgumentError "<what> must agree: <label> differs from <label>"). Returns the
    run-time assertions (none when every dim is known)."""
    dims = [(label, _backend.static_shape(t)[axis]) for label, t, axis in entries]
    dims_agree(dims, what)
    return _backend.dims_equal_at_run_time(entries, what)


def dense_attention_inputs(query, key, value, query_mask, key_mask):
    """Checks dense attention inputs (YOSO-E, the local window) against each other (value may be None).

    Returns (query, key, value, query_mask, key_mask), masks bool [B, N], made to depend on the
    run-time checks of the dims unknown while a TensorFlow graph is built.
    """
    query = float_tensor(query, "query", 3)
    key = float_tensor(key, "key", 3)
    values = [] if value is None else [("value", float_tensor(value, "value", 3))]
    masks = [(name, mask_tensor(mask, name))
             for name, mask in (("query_mask", query_mask), ("key_mask", key_mask)) if mask is not None]
    named = dict([("query", query), ("key", key)] + values + masks)
    checks = agree([("query", query, 2), ("key", key, 2)], "query and key widths (axis 2)")
    checks += agree([(name, t, 0) for name, t in named.items()], "batch sizes (axis 0)")
    checks += agree([(f"{name} axis 1", named[name], 1) for name in ("query", "query_mask") if name in named],
                    "query lengths")
    checks += agree([(f"{name} axis 1", named[name], 1) for name in ("key", "value", "key_mask") if name in named],
                    "key lengths")
    named = dict(zip(named, _backend.after(checks, list(named.values()))))
    query, key = named["query"], named["key"]
    qm = named.get("query_mask")
    km = named.get("key_mask")
    qm = ops.ones((ops.shape(query)[0], ops.shape(query)[1]), "bool") if qm is None else qm
    km = ops.ones((ops.shape(key)[0], ops.shape(key)[1]), "bool") if km is None else km
    return query, key, named.get("value"), qm, km
