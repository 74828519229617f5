"""The bad-input contract of docs/errors.md ("Ops"), row by row, and the NaN/Inf policy.

Every row runs eagerly on every backend, and on TensorFlow on the custom op and the composite,
also inside a `tf.function` whose input signature leaves the dimensions unknown (None), where a
shape check moves from graph construction (ValueError) to run time (InvalidArgumentError, same
message). Checks that need the data raise `DATA_ERROR` (InvalidArgumentError on TensorFlow,
ValueError elsewhere).
"""

import numpy as np
import pytest

from conftest import (BACKEND, DATA_ERROR, IMPLEMENTATIONS, TENSORFLOW, requires_custom_ops, requires_tensorflow,
                      to_numpy, traced)
from keras_yoso import _validation
from keras_yoso import ops
from keras_yoso.ops import _dispatch

if TENSORFLOW:
    import tensorflow as tf
if BACKEND == "torch":
    import torch

MODES = ["eager", "unknown_dims"] if TENSORFLOW else ["eager"]

QC = np.zeros((2, 3, 5), np.int32)
KC = np.zeros((2, 3, 6), np.int32)
V = np.ones((2, 6, 4), np.float32)
Q = np.full((2, 5, 8), 8 ** -0.5, np.float32)
K = np.full((2, 6, 8), 8 ** -0.5, np.float32)
QW = np.ones((2, 5, 2), np.float32)
KW = np.ones((2, 6, 2), np.float32)
QM = np.ones((2, 5), bool)
KM = np.ones((2, 6), bool)
def _spec(array, keep):
    """A TensorSpec with every dim unknown, except the axes in `keep` (None: unknown rank)."""
    if keep is None:
        return tf.TensorSpec(None, tf.as_dtype(array.dtype))
    return tf.TensorSpec([d if axis in keep else None for axis, d in enumerate(array.shape)],
                         tf.as_dtype(array.dtype))


def _run(fn, arrays, keep, mode):
    """fn(*arrays) eagerly, or traced with unknown dims (keep[i]: the static axes of arrays[i])."""
    if mode == "eager":
        return fn(*arrays)
    specs = [_spec(a, k) for a, k in zip(arrays, keep)]
    return tf.function(fn, input_signature=specs, autograph=False)(*arrays)


# Static axes in graph mode: num_hashes (axis 1 of the codes; the composite unrolls over it)
# and the feature axis of hash inputs. Everything else is unknown.
CODES_KEEP = (1,)
NONE_KEEP = ()


def _lsh(impl, qc=QC, kc=KC, v=V, qm=QM, km=KM, num_buckets=8, keep=None):
    fn = lambda qc, kc, v, qm, km: ops.lsh_cumulation(qc, kc, v, num_buckets, qm, km,  # noqa: E731
                                                      implementation=impl)
    return fn, [qc, kc, v, qm, km], keep or [CODES_KEEP, CODES_KEEP, NONE_KEEP, NONE_KEEP, NONE_KEEP]


def _weighted(impl, qc=QC, qw=QW, kc=KC, kw=KW, v=V, num_buckets=8, keep=None):
    fn = lambda qc, qw, kc, kw, v: ops.weighted_lsh_cumulation(qc, qw, kc, kw, v, num_buckets,  # noqa: E731
                                                               implementation=impl)
    return fn, [qc, qw, kc, kw, v], keep or [CODES_KEEP, NONE_KEEP, CODES_KEEP, NONE_KEEP, NONE_KEEP]


def _yoso(impl, q=Q, k=K, v=V, qc=QC, kc=KC, hash_code_len=3, backward="lower_bound"):
    fn = lambda q, k, v, qc, kc: ops.yoso_cumulation(q, k, v, qc, kc, hash_code_len, backward=backward,  # noqa: E731
                                                     implementation=impl)
    return fn, [q, k, v, qc, kc], [NONE_KEEP, NONE_KEEP, NONE_KEEP, CODES_KEEP, CODES_KEEP]


def _expectation(impl, q=Q, k=K, v=V, qm=QM, km=KM, hash_code_len=4, backward="lower_bound"):
    fn = lambda q, k, v, qm, km: ops.yoso_expectation(q, k, v, hash_code_len, qm, km, backward=backward,  # noqa: E731
                                                      implementation=impl)
    return fn, [q, k, v, qm, km], [NONE_KEEP] * 5


def _expectation_weights(impl, q=Q, k=K, qm=QM, km=KM, hash_code_len=4):
    del impl  # one implementation (dense TF ops)
    fn = lambda q, k, qm, km: ops.yoso_expectation_weights(q, k, hash_code_len, qm, km)  # noqa: E731
    return fn, [q, k, qm, km], [NONE_KEEP] * 4


def _linear_relative(impl, q=Q, k=K, v=V, qm=QM, km=KM):
    del impl  # one implementation (TF ops)
    fn = lambda q, k, v, qm, km: ops.linear_relative_attention(q, k, v, query_mask=qm, key_mask=km)  # noqa: E731
    return fn, [q, k, v, qm, km], [(2,), (2,), (2,), NONE_KEEP, NONE_KEEP]


def _hash(impl, x=np.ones((2, 5, 8), np.float32), num_hashes=2, hash_code_len=4, seed=0, method="gaussian",
          keep=None):
    fn = lambda x: ops.hash_codes(x, num_hashes, hash_code_len, seed, method, implementation=impl)  # noqa: E731
    return fn, [x], keep or [(x.ndim - 1,)]


# Shape rows: ValueError while the graph is built when the dims are known (eagerly, always);
# InvalidArgumentError with the same message when the graph runs, for dims left unknown.
SHAPE_ROWS = {
    "value_length": (lambda i: _lsh(i, v=np.ones((2, 7, 4), np.float32)), r"key lengths must agree"),
    "key_mask_length": (lambda i: _lsh(i, km=np.ones((2, 5), bool)), r"key lengths must agree"),
    "query_mask_length": (lambda i: _lsh(i, qm=np.ones((2, 4), bool)), r"query lengths must agree"),
    "value_batch": (lambda i: _lsh(i, v=np.ones((3, 6, 4), np.float32)),
                    r"batch sizes \(axis 0\) of the key inputs must agree"),
    "query_mask_batch": (lambda i: _lsh(i, qm=np.ones((3, 5), bool)),
                         r"batch sizes \(axis 0\) of the query inputs must agree"),
    "query_and_key_batch": (lambda i: _lsh(i, qc=np.zeros((3, 3, 5), np.int32), qm=np.ones((3, 5), bool)),
                            r"batch sizes \(axis 0\) of queries and keys must agree"),
    "num_hashes": (lambda i: _lsh(i, kc=np.zeros((2, 4, 6), np.int32),
                                  keep=[CODES_KEEP, NONE_KEEP, NONE_KEEP, NONE_KEEP, NONE_KEEP]),
                   r"num_hashes \(axis 1 of the codes\) must agree"),
    "weight_widths": (lambda i: _weighted(i, kw=np.ones((2, 6, 3), np.float32)),
                      r"weight widths \(axis 2 of query_weight and key_weight\) must agree"),
    "query_weight_length": (lambda i: _weighted(i, qw=np.ones((2, 4, 2), np.float32)), r"query lengths must agree"),
    "yoso_query_key_widths": (lambda i: _yoso(i, k=np.ones((2, 6, 7), np.float32)),
                              r"query and key widths \(axis 2\) must agree"),
    "yoso_query_length": (lambda i: _yoso(i, q=np.ones((2, 4, 8), np.float32)), r"query lengths must agree"),
    "yoso_key_length": (lambda i: _yoso(i, k=np.ones((2, 7, 8), np.float32)), r"key lengths must agree"),
    "expectation_widths": (lambda i: _expectation(i, k=np.ones((2, 6, 7), np.float32)),
                           r"query and key widths \(axis 2\) must agree"),
    "expectation_batch": (lambda i: _expectation(i, v=np.ones((3, 6, 4), np.float32)),
                          r"batch sizes \(axis 0\) must agree"),
    "expectation_key_length": (lambda i: _expectation(i, v=np.ones((2, 7, 4), np.float32)),
                               r"key lengths must agree"),
    "expectation_query_mask": (lambda i: _expectation(i, qm=np.ones((2, 4), bool)), r"query lengths must agree"),
    "expectation_weights_key_mask": (lambda i: _expectation_weights(i, km=np.ones((2, 5), bool)),
                                     r"key lengths must agree"),
    "expectation_weights_batch": (lambda i: _expectation_weights(i, k=np.ones((3, 6, 8), np.float32)),
                                  r"batch sizes \(axis 0\) must agree"),
    "linear_relative_batch": (lambda i: _linear_relative(i, v=np.ones((3, 6, 4), np.float32)),
                              r"batch sizes must agree"),
    "linear_relative_key_value_lengths": (lambda i: _linear_relative(i, v=np.ones((2, 7, 4), np.float32)),
                                          r"key and value lengths must agree"),
    "linear_relative_query_mask": (lambda i: _linear_relative(i, qm=np.ones((2, 4), bool)),
                                   r"query lengths must agree"),
    "linear_relative_key_mask": (lambda i: _linear_relative(i, km=np.ones((2, 5), bool)), r"key lengths must agree"),
}


@pytest.mark.parametrize("row", sorted(SHAPE_ROWS))
@pytest.mark.parametrize("mode", MODES)
def test_shape_row(implementation, row, mode):
    build, message = SHAPE_ROWS[row]
    fn, arrays, keep = build(implementation)
    error = ValueError if mode == "eager" else tf.errors.InvalidArgumentError
    with pytest.raises(error, match=message):
        _run(fn, arrays, keep, mode)


# Rank rows: ValueError for a wrong known rank; when the rank is unknown (TensorSpec(None)),
# tf.ensure_shape checks it at run time (TensorFlow's message, naming the graph tensor).
RANK_ROWS = {
    "value": (lambda i: _lsh(i, v=np.ones((2, 6), np.float32)), 2, r"value must have rank 3"),
    "key_mask": (lambda i: _lsh(i, km=np.ones((2, 6, 1), bool)), 4, r"key_mask must have shape \[batch, length\]"),
    "query_weight": (lambda i: _weighted(i, qw=np.ones((2, 5), np.float32)), 1, r"query_weight must have rank 3"),
    "query": (lambda i: _expectation(i, q=np.ones((2, 5), np.float32)), 0, r"query must have rank 3"),
}


def _unknown_rank_message(shape):
    return rf"Shape of tensor \S+ \[{shape}\] is not compatible with expected shape \[\?(,\?)*\]"


@pytest.mark.parametrize("row", sorted(RANK_ROWS))
def test_rank_row(implementation, row):
    build, index, message = RANK_ROWS[row]
    fn, arrays, keep = build(implementation)
    with pytest.raises(ValueError, match=message):
        _run(fn, arrays, keep, "eager")
    if not TENSORFLOW:
        return
    keep = list(keep)
    keep[index] = None
    shape = ",".join(str(d) for d in arrays[index].shape)
    with pytest.raises(tf.errors.InvalidArgumentError, match=_unknown_rank_message(shape)):
        _run(fn, arrays, keep, "unknown_rank")


def test_codes_of_wrong_rank(implementation):
    fn, arrays, keep = _lsh(implementation, qc=np.zeros((2, 5), np.int32))
    with pytest.raises(ValueError, match=r"query_codes must have shape \[batch, num_hashes, length\]"):
        _run(fn, arrays, keep, "eager")
    if not TENSORFLOW:
        return
    keep[0] = None
    if implementation == "composite":  # an unknown rank leaves num_hashes unknown: see the next row
        with pytest.raises(ValueError, match=r"num_hashes \(axis 1 of query_codes\) must be known"):
            _run(fn, arrays, keep, "unknown_rank")
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match=_unknown_rank_message("2,5")):
            _run(fn, arrays, keep, "unknown_rank")


@requires_tensorflow
def test_composite_needs_num_hashes_when_the_graph_is_built():
    fn, arrays, keep = _lsh("composite", keep=[NONE_KEEP, NONE_KEEP, NONE_KEEP, NONE_KEEP, NONE_KEEP])
    with pytest.raises(ValueError, match=r"num_hashes \(axis 1 of query_codes\) must be known when the graph is built"):
        _run(fn, arrays, keep, "unknown_dims")


@pytest.mark.parametrize("mode", MODES)
def test_zero_hashes(implementation, mode):
    fn, arrays, keep = _lsh(implementation, qc=np.zeros((2, 0, 5), np.int32), kc=np.zeros((2, 0, 6), np.int32))
    with pytest.raises(ValueError, match=r"query_codes must have num_hashes >= 1 \(axis 1\)"):
        _run(fn, arrays, keep, mode)


@requires_tensorflow
def test_zero_hashes_unknown_until_run_time_custom_op():
    if "custom_op" not in IMPLEMENTATIONS:
        pytest.skip("no custom ops expected (backend or KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
    fn, arrays, _ = _lsh("custom_op", qc=np.zeros((2, 0, 5), np.int32), kc=np.zeros((2, 0, 6), np.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"query_codes must have num_hashes >= 1 \(axis 1\)"):
        _run(fn, arrays, [NONE_KEEP] * 5, "unknown_dims")


# Value rows: InvalidArgumentError eagerly and in graphs (the check needs the data).
@pytest.mark.parametrize("bad", [-1, 8, 2 ** 30, -(2 ** 31)])
@pytest.mark.parametrize("mode", MODES)
def test_codes_outside_bucket_range(implementation, bad, mode):
    qc = QC.copy()
    qc[1, 2, 4] = bad
    with pytest.raises(DATA_ERROR, match=r"query_codes .*\[0, num_buckets\) = \[0, 8\)"):
        _run(*_lsh(implementation, qc=qc), mode=mode)
    kc = KC.copy()
    kc[0, 0, 0] = bad
    with pytest.raises(DATA_ERROR, match=r"key_codes .*\[0, num_buckets\) = \[0, 8\)"):
        _run(*_weighted(implementation, kc=kc), mode=mode)
    with pytest.raises(DATA_ERROR, match=r"key_codes .*\[0, num_buckets\) = \[0, 8\)"):
        _run(*_yoso(implementation, kc=kc), mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_int64_codes_beyond_int32_do_not_wrap_into_range(implementation, mode):
    kc = KC.astype(np.int64)
    kc[1, 1, 1] = 2 ** 32 + 3  # int32 wrap-around would make this the valid code 3
    with pytest.raises(DATA_ERROR, match=r"key_codes must hold codes in \[0, num_buckets\)"):
        _run(*_lsh(implementation, kc=kc), mode=mode)


# Argument rows: raised while the call is made (eagerly or while tracing), the same in both modes.
ARGUMENT_ROWS = {
    "num_buckets_not_power_of_two": (lambda i: _lsh(i, num_buckets=6), ValueError,
                                     r"num_buckets must be a power of two in \[1, 2\*\*20\], got 6"),
    "num_buckets_too_large": (lambda i: _lsh(i, num_buckets=2 ** 21), ValueError,
                              r"num_buckets must be an integer in \[1, 1048576\]"),
    "num_buckets_zero": (lambda i: _weighted(i, num_buckets=0), ValueError, r"num_buckets must be an integer"),
    "num_buckets_float": (lambda i: _lsh(i, num_buckets=2.0), ValueError, r"num_buckets must be an integer"),
    "codes_float": (lambda i: _lsh(i, qc=QC.astype(np.float32)), TypeError,
                    r"query_codes must be an integer tensor of hash codes, got dtype float32"),
    "value_int": (lambda i: _lsh(i, v=V.astype(np.int32)), TypeError,
                  r"value must be a floating-point tensor, got dtype int32"),
    "key_weight_int": (lambda i: _weighted(i, kw=KW.astype(np.int64)), TypeError,
                       r"key_weight must be a floating-point tensor"),
    "mask_string": (lambda i: _lsh(i, km=np.full((2, 6), "yes")), TypeError,
                    r"key_mask must be a bool or numeric tensor, got dtype string"),
    "yoso_hash_code_len": (lambda i: _yoso(i, hash_code_len=21), ValueError,
                           r"hash_code_len must be an integer in \[1, 20\], got 21"),
    "yoso_backward": (lambda i: _yoso(i, backward="exact"), ValueError,
                      r"backward must be one of \('lower_bound', 'collision'\), got 'exact'"),
    "expectation_backward": (lambda i: _expectation(i, backward="collision"), ValueError,
                             r"backward must be one of \('lower_bound', 'exact'\), got 'collision'"),
    "expectation_hash_code_len": (lambda i: _expectation(i, hash_code_len=0), ValueError,
                                  r"hash_code_len must be an integer in \[1, 30\], got 0"),
    "expectation_weights_hash_code_len": (lambda i: _expectation_weights(i, hash_code_len=31), ValueError,
                                          r"hash_code_len must be an integer in \[1, 30\], got 31"),
    "hash_num_hashes": (lambda i: _hash(i, num_hashes=0), ValueError, r"num_hashes must be an integer >= 1, got 0"),
    "hash_code_len_zero": (lambda i: _hash(i, hash_code_len=0), ValueError,
                           r"hash_code_len must be an integer in \[1, 30\], got 0"),
    "hash_code_len_31": (lambda i: _hash(i, hash_code_len=31), ValueError,
                         r"hash_code_len must be an integer in \[1, 30\], got 31"),
    "hash_method": (lambda i: _hash(i, method="simhash"), ValueError,
                    r"method must be one of \('gaussian', 'hadamard', 'hadamard_interleaved'\), got 'simhash'"),
    "hash_seed": (lambda i: _hash(i, seed=[1, 2, 3]), ValueError,
                  r"seed must be an int or an integer tensor of shape \[2\]"),
    "hash_x_rank": (lambda i: _hash(i, x=np.ones((4, 8), np.float32)), ValueError, r"x must have rank 3"),
    "hash_x_dtype": (lambda i: _hash(i, x=np.ones((1, 4, 8), np.int32)), TypeError,
                     r"x must be a floating-point tensor, got dtype int32"),
    "hash_x_no_features": (lambda i: _hash(i, x=np.ones((1, 4, 0), np.float32)), ValueError,
                           r"x must have at least one feature \(axis 2\)"),
    "hash_x_features_unknown": (lambda i: _hash(i, keep=[NONE_KEEP]), ValueError,
                                r"the last dimension of x must be known statically"),
}


@pytest.mark.parametrize("row", sorted(ARGUMENT_ROWS))
@pytest.mark.parametrize("mode", MODES)
def test_argument_row(implementation, row, mode):
    build, error, message = ARGUMENT_ROWS[row]
    fn, arrays, keep = build(implementation)
    if row == "hash_x_features_unknown" and mode == "eager":
        pytest.skip("every dim is known eagerly")
    with pytest.raises(error, match=message):
        _run(fn, arrays, keep, mode)


@pytest.mark.parametrize("implementation", ["cuda", "CUSTOM_OP", None])
def test_unknown_implementation(implementation):
    with pytest.raises(ValueError, match=r"implementation must be one of \('auto', 'custom_op', 'composite'\)"):
        ops.lsh_cumulation(QC, KC, V, 8, implementation=implementation)


def test_custom_op_requested_without_the_library(monkeypatch):
    monkeypatch.setattr(_dispatch, "native_provider", lambda: (None, "disabled for this test"))
    with pytest.raises(RuntimeError, match=r"implementation='custom_op' but the keras_yoso native kernels are not "
                                           r"loaded: disabled for this test"):
        ops.hash_codes(np.ones((1, 2, 3), np.float32), 2, 3, 0, implementation="custom_op")
    assert ops.lsh_cumulation(QC, KC, V, 8).shape == (2, 5, 4)  # "auto" falls back to the composite


def test_yoso_cumulation_backward_with_2_pow_20_buckets_and_wide_heads(implementation):
    # 2**20 buckets, value width 64, key width 32: the custom op's bucket tables stay per bucket.
    from conftest import vjp
    import numpy_reference as ref
    rng = np.random.default_rng(0)
    q, k = (rng.normal(size=(1, n, 32)).astype(np.float32) for n in (3, 4))
    v = rng.normal(size=(1, 4, 64)).astype(np.float32)
    qc, kc = np.array([[[5, 7, 9]]], np.int32), np.array([[[5, 1, 9, 5]]], np.int32)
    _, grads = vjp(lambda a, b, c: ops.yoso_cumulation(a, b, c, qc, kc, 20, implementation=implementation),
                   [q, k, v], np.ones((1, 3, 64)))
    want = ref.yoso_lower_bound_gradients(q, k, v, qc, kc, 20, np.ones((1, 3, 64)))
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


# Where the per-bucket table limit of the native kernels is met: the public op's check before any kernel
# (ValueError); the kernel's own check, reached through the native provider's raw call (InvalidArgumentError
# on TensorFlow, ValueError elsewhere: DATA_ERROR); on TensorFlow also the public op in a tf.function with
# unknown dims (the Python check cannot see the widths: the kernel raises when the function runs) and the
# raw op's shape function while a graph is built.
TABLE_LIMIT_PATHS = ["public_op", "kernel"] + (["public_op_unknown_dims", "shape_function"] if TENSORFLOW else [])


@requires_custom_ops
@pytest.mark.parametrize("path", TABLE_LIMIT_PATHS)
def test_per_bucket_table_over_the_limit_raises_before_allocating(path):
    # W * D = 2**15 * 2**14 = 2**29 floats: a 2 GiB [W, D] table per CPU worker (W * D with
    # 2**20 * 2**20 floats segfaulted before the limit existed).
    message = (r"per-bucket table of the weighted LSH cumulation, weight_dim \* value_dim = 32768 \* 16384 "
               r".* 2\*\*28 floats")
    qw, kw, v = (np.ones(shape, np.float32) for shape in [(2, 5, 2 ** 15), (2, 6, 2 ** 15), (2, 6, 2 ** 14)])
    fn, arrays, keep = _weighted("custom_op", qw=qw, kw=kw, v=v)
    native, load_error = _dispatch.native_provider()
    assert native is not None, load_error
    raw = (QM.astype(np.float32), QC, qw, KM.astype(np.float32), KC, kw, v, 2 ** 20, 0)  # ..., num_buckets, causal
    if BACKEND == "torch":
        raw = tuple(torch.as_tensor(a) if isinstance(a, np.ndarray) else a for a in raw)
    error, call = {
        "public_op": (ValueError, lambda: _run(fn, arrays, keep, "eager")),
        "kernel": (DATA_ERROR, lambda: native.run("weighted_lsh_cumulation", *raw)),
        "public_op_unknown_dims": (DATA_ERROR, lambda: _run(
            fn, arrays, [CODES_KEEP, NONE_KEEP, CODES_KEEP, NONE_KEEP, NONE_KEEP], "unknown_dims")),
        "shape_function": (ValueError, lambda: tf.function(
            lambda: native.run("weighted_lsh_cumulation", *raw)).get_concrete_function()),
    }[path]
    with pytest.raises(error, match=message):
        call()


@requires_tensorflow
def test_raw_custom_op_rejects_bad_shapes_without_crashing():
    if "custom_op" not in IMPLEMENTATIONS:
        pytest.skip("TensorFlow custom ops disabled")
    from keras_yoso.ops.providers import tensorflow as tf_provider
    IDE = (ValueError, tf.errors.InvalidArgumentError)
    lib = tf_provider.library()
    mask5, mask6 = np.ones((2, 5), np.float32), np.ones((2, 6), np.float32)
    with pytest.raises(IDE, match=r"key_codes must have shape \[batch, num_hashes, num_keys\] = \[2, 3, \?\]"):
        lib.yoso_lsh_cumulation(mask5, QC, mask6, np.zeros((2, 4, 6), np.int32), V, num_buckets=8)
    with pytest.raises(IDE, match="num_buckets"):
        lib.yoso_lsh_cumulation(mask5, QC, mask6, KC, V, num_buckets=12)
    with pytest.raises(IDE, match=r"value must have shape \[batch, num_keys, value_dim\]"):
        lib.yoso_lsh_cumulation(mask5, QC, mask6, KC, np.ones((2, 7, 4), np.float32), num_buckets=8)
    with pytest.raises(IDE, match=r"hash_code_len must be in \[1, 20\]"):
        tf.function(lambda: lib.yoso_collision_cumulation(mask5, QC, Q, QW, mask6, KC, K, KW, hash_code_len=21,
                                                          epsilon=1e-6))()
    with pytest.raises(IDE, match=r"epsilon must be >= 0, got nan"):
        lib.yoso_collision_cumulation(mask5, QC, Q, QW, mask6, KC, K, KW, hash_code_len=3, epsilon=float("nan"))
    x = np.ones((1, 2, 5), np.float32)
    with pytest.raises(IDE, match=r"Value for attr 'num_hashes' of 0 must be at least minimum 1"):
        lib.yoso_gaussian_hash_codes(x, np.ones((5, 4), np.float32), num_hashes=0, hash_code_len=4)
    with pytest.raises(IDE, match=r"signs must have shape \[num_blocks, 3, padded_dim\] with padded_dim a power"):
        lib.yoso_hadamard_hash_codes(x, np.ones((1, 3, 4), np.float32), num_hashes=1, hash_code_len=4)
    # 2**31 keys (an empty batch, so nothing is allocated): the collision estimator's int32 indices.
    keys = 2 ** 31
    empty_codes, empty_mask, empty = tf.zeros([0, 1, keys], tf.int32), tf.zeros([0, keys]), tf.zeros([0, keys, 2])
    with pytest.raises(IDE, match=r"key_codes must have num_keys <= 2\*\*31 - 1"):
        lib.yoso_collision_cumulation(tf.zeros([0, 5]), tf.zeros([0, 1, 5], tf.int32), tf.zeros([0, 5, 2]),
                                      tf.zeros([0, 5, 2]), empty_mask, empty_codes, empty, empty, hash_code_len=3,
                                      epsilon=1e-6)


@requires_tensorflow
def test_gpu_hadamard_hash_rejects_a_padded_dim_over_8192():
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("needs a GPU")
    if "custom_op" not in IMPLEMENTATIONS:
        pytest.skip("no custom ops expected (backend or KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
    with tf.device("GPU:0"), pytest.raises(tf.errors.InvalidArgumentError, match=r"padded_dim = 16384 .* 8192"):
        ops.hash_codes(np.ones((1, 2, 9000), np.float32), 2, 4, 0, "hadamard", implementation="custom_op")


# ----------------------------------------------------------------------------
# NaN / Inf policy (docs/errors.md, "NaN and Inf").

def _collides(qc, kc):
    """[B, Nq, Nk]: query i and key j share a code in at least one hash."""
    return (qc[:, :, :, None] == kc[:, :, None, :]).any(1)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("op", ["lsh", "weighted_value", "weighted_key_weight", "yoso"])
def test_a_nonfinite_value_reaches_only_the_queries_that_collide_with_it(implementation, op, special):
    rng = np.random.default_rng(1)
    qc, kc = rng.integers(0, 4, size=(2, 2, 9)).astype(np.int32), rng.integers(0, 4, size=(2, 2, 7)).astype(np.int32)
    v, kw = rng.normal(size=(2, 7, 3)).astype(np.float32), rng.normal(size=(2, 7, 2)).astype(np.float32)
    qw = rng.normal(size=(2, 9, 2)).astype(np.float32)
    q, k = rng.normal(size=(2, 9, 4)).astype(np.float32), rng.normal(size=(2, 7, 4)).astype(np.float32)

    def run(v, kw):
        if op == "lsh":
            return to_numpy(ops.lsh_cumulation(qc, kc, v, 4, implementation=implementation))
        if op == "yoso":
            return to_numpy(ops.yoso_cumulation(q, k, v, qc, kc, 2, implementation=implementation))
        return to_numpy(ops.weighted_lsh_cumulation(qc, qw, kc, kw, v, 4, implementation=implementation))

    clean = run(v, kw)
    dirty_v, dirty_kw = v.copy(), kw.copy()
    (dirty_kw if op == "weighted_key_weight" else dirty_v)[1, 4, 0] = special
    dirty = run(dirty_v, dirty_kw)
    reached = _collides(qc, kc)[1, :, 4]
    assert np.array_equal(np.delete(dirty, 1, 0), np.delete(clean, 1, 0)), "another batch row changed"
    assert np.array_equal(dirty[1, ~reached], clean[1, ~reached]), "a query that does not collide changed"
    assert reached.any() and not np.isfinite(dirty[1, reached]).all(axis=-1).any(), "a colliding query stayed finite"


def test_a_nonfinite_query_weight_makes_only_its_own_row_nonfinite(implementation):
    rng = np.random.default_rng(2)
    qc, kc = rng.integers(0, 4, size=(1, 2, 6)).astype(np.int32), rng.integers(0, 4, size=(1, 2, 5)).astype(np.int32)
    qw, kw = rng.normal(size=(1, 6, 2)).astype(np.float32), rng.normal(size=(1, 5, 2)).astype(np.float32)
    v = rng.normal(size=(1, 5, 3)).astype(np.float32)
    clean = to_numpy(ops.weighted_lsh_cumulation(qc, qw, kc, kw, v, 4, implementation=implementation))
    qw[0, 2, 1] = np.nan
    dirty = to_numpy(ops.weighted_lsh_cumulation(qc, qw, kc, kw, v, 4, implementation=implementation))
    assert np.isnan(dirty[0, 2]).all()
    assert np.array_equal(np.delete(dirty, 2, 1), np.delete(clean, 2, 1))


@pytest.mark.parametrize("special", [np.nan, np.inf])
def test_collision_estimator_spreads_a_nonfinite_key_only_to_colliding_queries(implementation, special):
    rng = np.random.default_rng(3)
    qc, kc = rng.integers(0, 4, size=(1, 2, 6)).astype(np.int32), rng.integers(0, 4, size=(1, 2, 5)).astype(np.int32)
    q, k = rng.normal(size=(1, 6, 4)).astype(np.float32), rng.normal(size=(1, 5, 4)).astype(np.float32)
    qw, kw = rng.normal(size=(1, 6, 2)).astype(np.float32), rng.normal(size=(1, 5, 2)).astype(np.float32)
    ones_q, ones_k = np.ones((1, 6), np.float32), np.ones((1, 5), np.float32)
    run = lambda k: to_numpy(ops.collision_cumulation(qc, q, qw, kc, k, kw, 2, ones_q, ones_k,  # noqa: E731
                                                      implementation=implementation))
    clean = run(k)
    k[0, 3, 2] = special
    dirty = run(k)
    reached = _collides(qc, kc)[0, :, 3]
    assert reached.any() and not reached.all()
    np.testing.assert_allclose(dirty[0, ~reached], clean[0, ~reached], rtol=1e-6)
    assert not np.isfinite(dirty[0, reached, 2]).any()


@requires_tensorflow
def test_nonfinite_collision_sums_agree_between_custom_op_and_composite():
    if "custom_op" not in IMPLEMENTATIONS:
        pytest.skip("TensorFlow custom ops disabled")
    rng = np.random.default_rng(4)
    qc, kc = np.zeros((1, 1, 3), np.int32), np.zeros((1, 1, 4), np.int32)
    q = np.full((1, 3, 2), 0.5 ** 0.5, np.float32)
    k = rng.normal(size=(1, 4, 2)).astype(np.float32)
    k[0, 0, 0], k[0, 1, 0], k[0, 2, 1] = np.inf, -np.inf, np.inf  # +Inf and -Inf meet in column 0
    qw = np.array([[[1.0], [-1.0], [0.0]]], np.float32)  # weights > 0, < 0 and == 0 (0 * Inf = NaN)
    kw = np.ones((1, 4, 1), np.float32)
    ones_q, ones_k = np.ones((1, 3), np.float32), np.ones((1, 4), np.float32)
    outs = [to_numpy(ops.collision_cumulation(qc, q, qw, kc, k, kw, 2, ones_q, ones_k, implementation=impl))
            for impl in IMPLEMENTATIONS]
    np.testing.assert_array_equal(np.isnan(outs[0]), np.isnan(outs[1]))
    np.testing.assert_array_equal(np.isposinf(outs[0]), np.isposinf(outs[1]))
    np.testing.assert_array_equal(np.isneginf(outs[0]), np.isneginf(outs[1]))


@pytest.mark.parametrize("method", _validation.HASH_METHODS)
def test_nan_in_a_hash_input_gives_code_zero_and_inf_a_defined_code(implementation, method):
    x = np.random.default_rng(5).normal(size=(2, 6, 5)).astype(np.float32)
    x[0, 1, 3] = np.nan
    x[1, 2, 0] = np.inf
    x[1, 4, :] = -np.inf
    codes = to_numpy(ops.hash_codes(x, 4, 6, seed=1, method=method, implementation=implementation))
    assert (codes[0, :, 1] == 0).all()
    assert codes.min() >= 0 and codes.max() < 2 ** 6
    finite_rows = np.isfinite(x).all(axis=-1)
    if "custom_op" in IMPLEMENTATIONS:
        other = "composite" if implementation == "custom_op" else "custom_op"
        other_codes = to_numpy(ops.hash_codes(x, 4, 6, seed=1, method=method, implementation=other))
        # Finite rows agree; so do NaN rows (code 0). With +-Inf the Gaussian projections agree
        # (IEEE sums of the same terms), the Hadamard ones may not: the composite multiplies by the
        # transform's matrix, whose zero entries make Inf * 0 = NaN where the kernel's butterflies
        # produce +-Inf (docs/errors.md, "NaN and Inf").
        rows = np.ones_like(finite_rows) if method == "gaussian" else finite_rows
        rows[0, 1] = True
        np.testing.assert_array_equal(codes.transpose(0, 2, 1)[rows], other_codes.transpose(0, 2, 1)[rows])


def test_nan_in_masked_keys_never_reaches_the_output(implementation):
    v = V.copy()
    v[:, 5] = np.nan
    km = np.ones((2, 6), bool)
    km[:, 5] = False
    out = to_numpy(ops.lsh_cumulation(QC, KC, v, 8, key_mask=km, implementation=implementation))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, np.full((2, 5, 4), 5.0), rtol=1e-6)


def test_yoso_expectation_is_dense_so_a_nonfinite_kept_value_reaches_every_query():
    rng = np.random.default_rng(6)
    q, k = rng.normal(size=(1, 4, 3)).astype(np.float32), rng.normal(size=(1, 5, 3)).astype(np.float32)
    v = rng.normal(size=(1, 5, 2)).astype(np.float32)
    v[0, 2, 1] = np.nan
    out = to_numpy(ops.yoso_expectation(q, k, v, 4))
    assert np.isnan(out[0, :, 1]).all() and np.isfinite(out[0, :, 0]).all()
    km = np.ones((1, 5), bool)
    km[0, 2] = False
    assert np.isfinite(to_numpy(ops.yoso_expectation(q, k, v, 4, key_mask=km))).all()


# ----------------------------------------------------------------------------
# Strings and soft masks (issue item 7): string inputs name the argument and the dtype expected;
# a float mask holds 0 and 1 only (eagerly checked), not weights.

def _strings(shape):
    """A string input in every form a user may pass: a Python str, NumPy str and bytes arrays, tf.string."""
    forms = {"python_str": "hello", "numpy_str": np.full(shape, "a"), "numpy_bytes": np.full(shape, b"a")}
    if TENSORFLOW:
        forms["tf_string"] = tf.fill(shape, "a")
    return forms


STRING_OP_ROWS = {  # argument -> (call with that argument replaced, expected dtype in the message)
    "x": (lambda s: ops.hash_codes(s, 2, 4, seed=0), "floating-point"),
    "value": (lambda s: ops.lsh_cumulation(QC, KC, s, 8), "floating-point"),
    "query_codes": (lambda s: ops.lsh_cumulation(s, KC, V, 8), "integer tensor of hash codes"),
    "key_mask": (lambda s: ops.lsh_cumulation(QC, KC, V, 8, key_mask=s), "bool or numeric"),
    "query": (lambda s: ops.yoso_cumulation(s, K, V, QC, KC, 3), "floating-point"),
    "query_mask": (lambda s: ops.yoso_expectation(Q, K, V, 4, query_mask=s), "bool or numeric"),
    "key": (lambda s: ops.linear_relative_attention(Q, s, V), "floating-point"),
}


@pytest.mark.parametrize("argument", sorted(STRING_OP_ROWS))
def test_string_inputs_to_the_ops_name_the_argument_and_the_expected_dtype(argument):
    call, expected = STRING_OP_ROWS[argument]
    shape = {"x": (2, 5, 8), "value": V.shape, "query_codes": QC.shape, "key_mask": KM.shape, "query": Q.shape,
             "query_mask": QM.shape, "key": K.shape}[argument]
    for form, string in _strings(shape).items():
        with pytest.raises(TypeError, match=f"^{argument} must be a[n]? {expected}.*got dtype string"):
            call(string)


@pytest.mark.parametrize("argument", ["query", "value", "key"])
@pytest.mark.parametrize("layer_name", ["YosoAttention", "LinearRelativeAttention"])
def test_string_inputs_to_the_attention_layers_name_the_argument_and_the_expected_dtype(layer_name, argument):
    from keras_yoso import layers

    x = np.ones((2, 6, 8), np.float32)
    options = {"num_hashes": 2, "hash_code_len": 3} if layer_name == "YosoAttention" else {}
    for form, string in _strings((2, 6, 8)).items():
        arguments = {"query": x, "value": x, "key": x, argument: string}
        layer = getattr(layers, layer_name)(2, 4, **options)
        with pytest.raises(ValueError, match=f"argument `{argument}`: expected a floating-point tensor. "
                                             f"Received: {argument} of dtype string"):
            layer(arguments["query"], arguments["value"], key=arguments["key"])


def test_string_inputs_to_the_encoder_block_name_the_argument_and_the_expected_dtype():
    from keras_yoso import layers

    for form, string in _strings((2, 6, 8)).items():
        with pytest.raises(ValueError, match="argument `inputs`: expected a floating-point tensor. "
                                             "Received: inputs of dtype string"):
            layers.TransformerEncoderBlock(2, 16)(string)


SOFT_MASK_OPS = {
    "lsh_cumulation": lambda qm, km: ops.lsh_cumulation(QC, KC, V, 8, query_mask=qm, key_mask=km),
    "yoso_expectation": lambda qm, km: ops.yoso_expectation(Q, K, V, 4, query_mask=qm, key_mask=km),
    "linear_relative_attention": lambda qm, km: ops.linear_relative_attention(Q, K, V, query_mask=qm, key_mask=km),
}


def _soft(mask, value):
    soft = mask.astype(np.float32)
    soft[1, 2] = value
    return soft


@pytest.mark.parametrize("value", [0.5, np.nan, 2.0, -1.0])
@pytest.mark.parametrize("op", sorted(SOFT_MASK_OPS))
def test_a_float_mask_other_than_0_and_1_is_refused_eagerly_naming_the_argument_and_a_value(op, value):
    call = SOFT_MASK_OPS[op]
    with pytest.raises(ValueError, match=rf"^key_mask must be bool or hold only 0 and 1 .*got a value {value!r}"):
        call(None, _soft(KM, value))
    with pytest.raises(ValueError, match=rf"^query_mask must be bool or hold only 0 and 1 .*got a value {value!r}"):
        call(_soft(QM, value), None)


@pytest.mark.parametrize("op", sorted(SOFT_MASK_OPS))
def test_a_float_mask_of_0_and_1_equals_the_bool_mask(op):
    qm, km = QM.copy(), KM.copy()
    qm[0, 1], km[1, 2], km[0, 0] = False, False, False
    np.testing.assert_array_equal(to_numpy(SOFT_MASK_OPS[op](qm.astype(np.float32), km.astype(np.float32))),
                                  to_numpy(SOFT_MASK_OPS[op](qm, km)))


def test_a_soft_mask_given_to_the_layers_is_refused_naming_the_argument_and_a_value():
    from keras_yoso import layers

    x = np.ones((2, 6, 8), np.float32)
    soft = np.ones((2, 6), np.float32)
    soft[1, 3] = 0.5
    for layer in (layers.YosoAttention(2, 4, num_hashes=2, hash_code_len=3), layers.LinearRelativeAttention(2, 4)):
        for name in ("query_mask", "value_mask", "key_mask"):
            with pytest.raises(ValueError, match=rf"argument `{name}`: expected a bool mask or a float mask of 0s "
                                                 rf"and 1s .*Received: {name} holding 0.5"):
                layer(x, x, **{name: soft})
    block = layers.TransformerEncoderBlock(2, 16)
    with pytest.raises(ValueError, match=r"argument `padding_mask`: .*Received: padding_mask holding 0.5"):
        block(x, padding_mask=soft)


@pytest.mark.parametrize("op", sorted(SOFT_MASK_OPS))
def test_in_a_compiled_function_any_nonzero_float_mask_value_keeps(op):
    soft = np.where(KM, np.float32(0.5), np.float32(0.0))
    soft[1, 2] = 0.0
    soft[0, 3] = np.nan  # nonzero: keeps, as in keras.layers.MultiHeadAttention (mask cast to bool)
    got = to_numpy(traced(lambda km: SOFT_MASK_OPS[op](None, km))(soft))
    np.testing.assert_allclose(got, to_numpy(SOFT_MASK_OPS[op](None, soft != 0)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", sorted(SOFT_MASK_OPS))
def test_a_float_mask_whose_values_are_known_is_checked_inside_a_compiled_function_too(op):
    # A NumPy mask (or an eager tensor) closed over by a tf.function or jax.jit has values while the
    # function is traced: it is checked as eagerly, not read through graph ops (which failed to read back).
    valid = KM.astype(np.float32)
    valid[1, 2] = 0.0
    got = to_numpy(traced(lambda: SOFT_MASK_OPS[op](None, valid))())
    np.testing.assert_allclose(got, to_numpy(SOFT_MASK_OPS[op](None, valid != 0)), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"^key_mask must be bool or hold only 0 and 1 .*got a value 0.5"):
        traced(lambda: SOFT_MASK_OPS[op](None, _soft(KM, 0.5)))()
