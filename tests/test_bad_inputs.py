"""Bad inputs raise clear Python exceptions naming the argument, on both implementations."""

import numpy as np
import pytest
import tensorflow as tf

from keras_yoso import ops

QC = np.zeros((2, 3, 5), np.int32)
KC = np.zeros((2, 3, 6), np.int32)
V = np.ones((2, 6, 4), np.float32)
Q = np.ones((2, 5, 8), np.float32) / np.sqrt(8)
K = np.ones((2, 6, 8), np.float32) / np.sqrt(8)


@pytest.mark.parametrize("num_buckets", [0, 3, 2 ** 21, 6, -4, 2.0])
def test_num_buckets_must_be_power_of_two_up_to_2_pow_20(implementation, num_buckets):
    with pytest.raises(ValueError, match="num_buckets"):
        ops.lsh_cumulation(QC, KC, V, num_buckets, implementation=implementation)


@pytest.mark.parametrize("bad", [-1, 8, 2 ** 30])
def test_codes_outside_bucket_range_raise_invalid_argument(implementation, bad):
    qc = QC.copy()
    qc[1, 2, 4] = bad
    with pytest.raises(tf.errors.InvalidArgumentError, match="query_codes"):
        ops.lsh_cumulation(qc, KC, V, 8, implementation=implementation)
    kc = KC.copy()
    kc[0, 0, 0] = bad
    with pytest.raises(tf.errors.InvalidArgumentError, match="key_codes"):
        ops.weighted_lsh_cumulation(QC, np.ones((2, 5, 2), np.float32), kc, np.ones((2, 6, 2), np.float32), V, 8,
                                    implementation=implementation)
    with pytest.raises(tf.errors.InvalidArgumentError, match="key_codes"):
        ops.yoso_cumulation(Q, K, V, QC, kc, 3, implementation=implementation)


def test_codes_outside_range_are_caught_inside_tf_function_with_unknown_shapes(implementation):
    @tf.function(input_signature=[tf.TensorSpec([None, 3, None], tf.int32), tf.TensorSpec([None, 3, None], tf.int32),
                                  tf.TensorSpec([None, None, 4], tf.float32)])
    def run(qc, kc, v):
        return ops.lsh_cumulation(qc, kc, v, 8, implementation=implementation)

    assert run(QC, KC, V).shape == (2, 5, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="key_codes"):
        run(QC, KC + 9, V)


@pytest.mark.parametrize("kwargs,match", [
    (dict(query_codes=np.zeros((2, 5), np.int32)), "query_codes"),
    (dict(key_codes=np.zeros((2, 4, 6), np.int32)), "num_hashes"),
    (dict(key_codes=np.zeros((3, 3, 6), np.int32)), "batch"),
    (dict(value=np.ones((2, 7, 4), np.float32)), "key lengths"),
    (dict(value=np.ones((2, 6), np.float32)), "value"),
    (dict(query_mask=np.ones((2, 4), bool)), "query lengths"),
    (dict(key_mask=np.ones((2, 6, 1), bool)), "key_mask"),
    (dict(query_codes=np.zeros((2, 3, 5), np.float32)), "query_codes"),
    (dict(value=np.ones((2, 6, 4), np.int32)), "value"),
])
def test_mismatched_shapes_and_dtypes_name_the_argument(implementation, kwargs, match):
    args = dict(query_codes=QC, key_codes=KC, value=V, num_buckets=8)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        ops.lsh_cumulation(**args, implementation=implementation)


def test_raw_custom_op_rejects_bad_shapes_without_crashing():
    if not ops.custom_ops_available():
        pytest.skip("custom ops not built")
    from keras_yoso.ops._library import library
    lib = library()
    mask5, mask6 = np.ones((2, 5), np.float32), np.ones((2, 6), np.float32)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="num_hashes|key_codes|Dimension"):
        lib.yoso_lsh_cumulation(mask5, QC, mask6, np.zeros((2, 4, 6), np.int32), V, num_buckets=8)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="num_buckets"):
        lib.yoso_lsh_cumulation(mask5, QC, mask6, KC, V, num_buckets=12)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="value|Dimension"):
        lib.yoso_lsh_cumulation(mask5, QC, mask6, KC, np.ones((2, 7, 4), np.float32), num_buckets=8)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(num_hashes=0), ValueError, "num_hashes"),
    (dict(hash_code_len=0), ValueError, "hash_code_len"),
    (dict(hash_code_len=31), ValueError, "hash_code_len"),
    (dict(method="simhash"), ValueError, "method"),
    (dict(seed=[1, 2, 3]), ValueError, "seed"),
    (dict(x=np.ones((4, 8), np.float32)), ValueError, "x"),
    (dict(implementation="cuda"), ValueError, "implementation"),
])
def test_hash_codes_argument_errors(kwargs, error, match):
    args = dict(x=np.ones((1, 4, 8), np.float32), num_hashes=2, hash_code_len=4, seed=0)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ops.hash_codes(**args)


@pytest.mark.parametrize("kwargs,match", [
    (dict(hash_code_len=21), "hash_code_len"),
    (dict(backward="exact"), "backward"),
    (dict(key=np.ones((2, 6, 7), np.float32)), "widths"),
])
def test_yoso_cumulation_argument_errors(kwargs, match):
    args = dict(query=Q, key=K, value=V, query_codes=QC, key_codes=KC, hash_code_len=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        ops.yoso_cumulation(**args)


def test_yoso_expectation_rejects_unknown_backward():
    with pytest.raises(ValueError, match="backward"):
        ops.yoso_expectation(Q, K, V, 4, backward="collision")


def test_nan_in_masked_keys_never_reaches_the_output(implementation):
    v = V.copy()
    v[:, 5] = np.nan
    km = np.ones((2, 6), bool)
    km[:, 5] = False
    out = ops.lsh_cumulation(QC, KC, v, 8, key_mask=km, implementation=implementation).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, np.full((2, 5, 4), 5.0), rtol=1e-6)
