"""keras_yoso._validation and the kernels hold the same limits and say them the same way.

The limits of custom_ops/cc/kernels/yoso_common.h are read from the source text and compared with
keras_yoso._validation's. For the limits both sides check (num_buckets, the weighted cumulation's
per-bucket table), the message of the Python side must appear word for word in the message of the
kernels' checks (yoso_checks.h), reached through every wrapper built here: the TensorFlow op's
shape function and kernel, and the C ABI of the native library. The bad inputs have a batch of 0,
so the kernels reject them before anything is allocated or read.

Seeds: the one derivation of sublayer seeds (`derived_seed`) gives the values of the formulas saved
models were made with.
"""

import ast
import operator
import os
import re

import numpy as np
import pytest

from conftest import CUSTOM_OPS_EXPECTED, TENSORFLOW
from keras_yoso import _validation
from keras_yoso import ops

if TENSORFLOW:
    import tensorflow as tf

COMMON_H = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "custom_ops", "cc", "kernels", "yoso_common.h")
_BINARY_OPERATORS = {ast.LShift: operator.lshift, ast.Mult: operator.mul, ast.Add: operator.add,
                     ast.Sub: operator.sub}


def _evaluate(node):
    """The value of a C++ integer expression made of literals and << * + -."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        return _BINARY_OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError(f"not an integer literal expression: {ast.dump(node)}")


def _header_constants(path):
    """{name: value} of the `constexpr <type> kName = <integer expression>;` lines of a C++ header."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    constants = {}
    for name, expression in re.findall(r"constexpr\s+\w+\s+(k\w+)\s*=\s*([^;]+);", text):
        expression = re.sub(r"int64_t\{(\d+)\}", r"\1", expression)
        try:
            constants[name] = _evaluate(ast.parse(expression.strip(), mode="eval").body)
        except (SyntaxError, ValueError):
            continue  # e.g. kMaxCollisionKeys = INT32_MAX: no limit of _validation
    return constants


@pytest.mark.parametrize("kernel_name, python_name", [
    ("kMaxNumBuckets", "MAX_NUM_BUCKETS"),
    ("kMaxHashCodeLen", "MAX_HASH_CODE_LEN"),
    ("kMaxCollisionHashCodeLen", "MAX_CUMULATION_HASH_CODE_LEN"),
    ("kMaxBucketTableFloats", "MAX_BUCKET_TABLE_FLOATS"),
])
def test_python_limit_equals_the_kernels_constant(kernel_name, python_name):
    constants = _header_constants(COMMON_H)
    assert kernel_name in constants, f"{kernel_name} not found in {COMMON_H}"
    assert constants[kernel_name] == getattr(_validation, python_name)


# --- the same bad input on both sides ----------------------------------------------------------------

BAD_NUM_BUCKETS = 6
# One more weight column than the per-bucket table holds: W * D = (2**14 + 1) * 2**14 floats.
TABLE_VALUE_DIM = 2 ** 14
TABLE_WEIGHT_DIM = _validation.MAX_BUCKET_TABLE_FLOATS // TABLE_VALUE_DIM + 1


def _python_message(check, *args):
    with pytest.raises(ValueError) as info:
        check(*args)
    return str(info.value)


def _python_num_buckets_message():
    """The message of the public op on the composite (it checks num_buckets in Python)."""
    codes = np.zeros((1, 1, 2), np.int32)
    return _python_message(lambda: ops.lsh_cumulation(codes, codes, np.ones((1, 2, 3), np.float32),
                                                      BAD_NUM_BUCKETS, implementation="composite"))


def _python_table_message():
    return _python_message(_validation.check_bucket_table, TABLE_WEIGHT_DIM, TABLE_VALUE_DIM)


# Inputs of the two cumulations as (shape, dtype), in the C ABI's and REGISTER_OP's order.
_LSH_INPUTS = [((0, 1), "float32"), ((0, 1, 1), "int32"), ((0, 1), "float32"), ((0, 1, 1), "int32"),
               ((0, 1, 3), "float32")]
_WEIGHTED_INPUTS = [((0, 1), "float32"), ((0, 1, 1), "int32"), ((0, 1, TABLE_WEIGHT_DIM), "float32"),
                    ((0, 1), "float32"), ((0, 1, 1), "int32"), ((0, 1, TABLE_WEIGHT_DIM), "float32"),
                    ((0, 1, TABLE_VALUE_DIM), "float32")]
CASES = {
    "num_buckets": ("lsh_cumulation", _LSH_INPUTS, BAD_NUM_BUCKETS, _python_num_buckets_message),
    "bucket_table": ("weighted_lsh_cumulation", _WEIGHTED_INPUTS, 2 ** 20, _python_table_message),
}


def _tf_library():
    from keras_yoso.ops.providers import tensorflow as tf_provider
    library = tf_provider.library()
    assert library is not None, tf_provider.load_error()
    return library


def _tf_kernel_message(op, inputs, num_buckets):
    """The TensorFlow kernel's message (an eager call runs no shape function)."""
    raw_op = getattr(_tf_library(), "yoso_" + op)
    tensors = [tf.zeros(shape, dtype) for shape, dtype in inputs]
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        raw_op(*tensors, num_buckets=num_buckets)
    return info.value.message


def _tf_shape_function_message(op, inputs, num_buckets):
    """The message of the op's shape function, which runs while a graph is built."""
    raw_op = getattr(_tf_library(), "yoso_" + op)
    tensors = [tf.zeros(shape, dtype) for shape, dtype in inputs]
    with pytest.raises(ValueError) as info:
        tf.function(lambda: raw_op(*tensors, num_buckets=num_buckets)).get_concrete_function()
    return str(info.value)


def _c_abi_message(op, inputs, num_buckets):
    """The message of the native library's C ABI (native_library raises it as ValueError)."""
    from keras_yoso.ops.providers import native_library
    assert native_library.library() is not None, native_library.load_error()
    views = [native_library.tensor_view(None, dtype, shape) for shape, dtype in inputs]
    output = native_library.tensor_view(None, "float32", (0, 1, inputs[-1][0][2]))
    with pytest.raises(ValueError) as info:
        native_library.call(op, views, [num_buckets, 0], [output])  # causal = 0
    return str(info.value)


WRAPPERS = {"c_abi": _c_abi_message}
if TENSORFLOW:
    WRAPPERS.update(tf_kernel=_tf_kernel_message, tf_shape_function=_tf_shape_function_message)


@pytest.mark.skipif(not CUSTOM_OPS_EXPECTED, reason="no native kernels expected (KERAS_YOSO_DISABLE_CUSTOM_OPS=1)")
@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_message_contains_the_python_message(case, wrapper):
    op, inputs, num_buckets, python_message = CASES[case]
    expected = python_message()
    assert str(BAD_NUM_BUCKETS if case == "num_buckets" else TABLE_WEIGHT_DIM) in expected
    assert expected in WRAPPERS[wrapper](op, inputs, num_buckets)


# The TensorFlow shape functions are the kernels' checks (yoso_primitives.h's Check) run on the dims a graph
# knows: a mismatch between known dims fails while the graph is built, with the message the kernel gives when it
# runs; unknown dims match anything; the output dims are the ones Check computes.
_F32, _I32 = "float32", "int32"
_SHAPE_CASES = {  # raw op, its inputs (shape, dtype), attributes, a fragment of the kernel's message
    "value_length": ("lsh_cumulation", [((2, 5), _F32), ((2, 3, 5), _I32), ((2, 6), _F32), ((2, 3, 6), _I32),
                                        ((2, 7, 4), _F32)], {"num_buckets": 8},
                     r"value must have shape \[batch, num_keys, value_dim\] = \[2, 6, \?\], got \[2,7,4\]"),
    "key_hashes": ("lsh_cumulation", [((2, 5), _F32), ((2, 3, 5), _I32), ((2, 6), _F32), ((2, 4, 6), _I32),
                                      ((2, 6, 4), _F32)], {"num_buckets": 8},
                   r"key_codes must have shape \[batch, num_hashes, num_keys\] = \[2, 3, \?\], got \[2,4,6\]"),
    "causal_lengths": ("lsh_cumulation", [((2, 5), _F32), ((2, 3, 5), _I32), ((2, 6), _F32), ((2, 3, 6), _I32),
                                          ((2, 6, 4), _F32)], {"num_buckets": 8, "causal": 1},
                       r"causal = 1 needs as many queries as keys .* num_queries = 5 and num_keys = 6"),
    "gradient_width": ("lower_bound_gradients", [((1, 5), _F32), ((1, 2, 5), _I32), ((1, 5, 4), _F32),
                                                 ((1, 6), _F32), ((1, 2, 6), _I32), ((1, 6, 3), _F32),
                                                 ((1, 6, 8), _F32), ((1, 5, 8), _F32)], {"num_buckets": 4},
                       r"key must have shape \[batch, num_keys, dim\] = \[1, 6, 4\], got \[1,6,3\]"),
    "projection": ("gaussian_hash_codes", [((1, 2, 5), _F32), ((5, 7), _F32)], {"num_hashes": 2, "hash_code_len": 4},
                   r"projection must have shape \[dim, num_hashes \* hash_code_len\] = \[5, 8\], got \[5,7\]"),
    "step_tables": ("lsh_cumulation_step", [((1, 2), _F32), ((1, 3, 2), _I32), ((1, 2), _F32), ((1, 3, 2), _I32),
                                            ((1, 2, 4), _F32), ((1, 3, 8, 5), _F32)], {},
                    r"tables must have shape \[batch, num_hashes, num_buckets, value_dim\] = \[1, 3, \?, 4\]"),
}


@pytest.mark.skipif(not (TENSORFLOW and CUSTOM_OPS_EXPECTED), reason="TensorFlow's op library")
@pytest.mark.parametrize("wrapper", ["tf_kernel", "tf_shape_function"])
@pytest.mark.parametrize("case", sorted(_SHAPE_CASES))
def test_tf_shape_function_rejects_what_the_kernel_rejects_with_the_kernels_message(case, wrapper):
    op, inputs, attributes, message = _SHAPE_CASES[case]
    raw_op = getattr(_tf_library(), "yoso_" + op)
    tensors = [tf.zeros(shape, dtype) for shape, dtype in inputs]
    if wrapper == "tf_kernel":  # eagerly: no shape function runs
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            raw_op(*tensors, **attributes)
    else:
        with pytest.raises(ValueError, match=message):
            tf.function(lambda: raw_op(*tensors, **attributes)).get_concrete_function()


@pytest.mark.skipif(not (TENSORFLOW and CUSTOM_OPS_EXPECTED), reason="TensorFlow's op library")
def test_tf_shape_function_lets_unknown_dims_pass_and_gives_the_output_dims_it_knows():
    library = _tf_library()
    spec = tf.TensorSpec
    # Batch and lengths unknown, widths known: no false error, the widths reach the outputs.
    lsh = tf.function(lambda qm, qc, km, kc, v: library.yoso_lsh_cumulation(qm, qc, km, kc, v, num_buckets=8, causal=1))
    out = lsh.get_concrete_function(spec([None, None]), spec([None, 3, None], tf.int32), spec([None, None]),
                                    spec([None, 3, None], tf.int32), spec([None, None, 4])).structured_outputs
    assert out.shape.as_list() == [None, None, 4]
    lower = tf.function(lambda *t: library.yoso_lower_bound_gradients(*t, num_buckets=8))
    dq, dk = lower.get_concrete_function(
        spec([2, 5]), spec([2, 3, 5], tf.int32), spec([2, 5, 6]), spec([None, None]), spec([None, 3, None], tf.int32),
        spec([None, None, None]), spec([None, None, 8]), spec([None, None, 8])).structured_outputs
    assert dq.shape.as_list() == [2, 5, 6] and dk.shape.as_list() == [2, None, 6]
    # Unknown rank: taken as the input's rank, every dim unknown.
    hashed = tf.function(lambda x, p: library.yoso_gaussian_hash_codes(x, p, num_hashes=2, hash_code_len=4))
    codes = hashed.get_concrete_function(spec(None), spec([None, 8])).structured_outputs
    assert codes.shape.as_list() == [None, 2, None]
    # A known mismatch beside unknown dims still fails while the graph is built (a new tf.function: the first
    # one would reuse its more general trace).
    lsh = tf.function(lambda qm, qc, km, kc, v: library.yoso_lsh_cumulation(qm, qc, km, kc, v, num_buckets=8))
    with pytest.raises(ValueError, match=r"value must have shape \[batch, num_keys, value_dim\] = \[\?, 6, \?\]"):
        lsh.get_concrete_function(spec([None, 5]), spec([None, 3, 5], tf.int32), spec([None, 6]),
                                  spec([None, 3, 6], tf.int32), spec([None, 5, 4]))


# Seeds near the wrap-around at 2**31, where the formulas' "% 2 ** 31" matters.
_SEEDS = (0, 5, 2 ** 31 - 8, 2 ** 31 - 1)


def _old_seed_formulas(seed):
    """The seeds derived from `seed` before derived_seed, written as the formulas saved models were
    made with: CausalLM block i, (seed + 7 i) % 2**31; a TransformerEncoderBlock's dropouts, (seed + 1)
    and (seed + 2) % 2**31; replace_attention's layer cloned after i others, (seed + i) % 2**31."""
    blocks = [(seed + 7 * i) % 2 ** 31 for i in range(3)]
    return {"blocks": blocks, "dropouts": [((s + 1) % 2 ** 31, (s + 2) % 2 ** 31) for s in blocks],
            "replaced": [(seed + 1) % 2 ** 31, (seed + 3) % 2 ** 31]}


@pytest.mark.parametrize("seed", _SEEDS)
def test_derived_seeds_are_bit_identical_to_the_formulas_saved_models_were_made_with(seed):
    import keras

    from keras_yoso import replace_attention
    from keras_yoso.models import CausalLM

    for stream in (0, 1, 2, 7, 14, 1000):
        assert _validation.derived_seed(seed, stream) == (seed + stream) % 2 ** 31
    expected = _old_seed_formulas(seed)
    model = CausalLM(10, 8, hidden_dim=8, num_layers=3, num_heads=2, intermediate_dim=8,
                     attention_kwargs={"seed": seed, "num_hashes": 2, "hash_code_len": 2})
    model(np.zeros((1, 2), "int32"))
    assert [block.attention_kwargs["seed"] for block in model.blocks] == expected["blocks"]
    assert [(block._attention_dropout.seed, block._output_dropout.seed) for block in model.blocks] == \
        expected["dropouts"]
    inputs = keras.Input((6, 8))
    x = keras.layers.Dense(8, name="embed")(inputs)  # cloned first: the attentions come after 1 and 3 others
    x = keras.layers.MultiHeadAttention(2, 4, name="first")(x, x)
    x = keras.layers.Dense(8, name="between")(x)
    x = keras.layers.MultiHeadAttention(2, 4, name="second")(x, x)
    converted = replace_attention(keras.Model(inputs, x), num_hashes=2, hash_code_len=2, seed=seed)
    assert [converted.get_layer(name).seed for name in ("first", "second")] == expected["replaced"]


# --- defaults and names ------------------------------------------------------------------------------

def test_yoso_attention_takes_its_hash_defaults_from_validation():
    import inspect

    from keras_yoso import YosoAttention

    parameters = inspect.signature(YosoAttention.__init__).parameters
    assert parameters["num_hashes"].default == _validation.DEFAULT_NUM_HASHES == 32
    assert parameters["hash_code_len"].default == _validation.DEFAULT_HASH_CODE_LEN == 6
    layer = YosoAttention(2, 4)
    assert (layer.num_hashes, layer.hash_code_len) == (_validation.DEFAULT_NUM_HASHES,
                                                       _validation.DEFAULT_HASH_CODE_LEN)


def test_no_check_parameter_shadows_or_dodges_a_check_of_the_same_name():
    # A parameter named like a check of the module (num_buckets) would hide it in the body; one with a
    # trailing underscore (num_buckets_) dodges it with a name that says nothing more.
    import inspect

    checks = {name for name, value in vars(_validation).items() if inspect.isfunction(value)}
    for name, function in vars(_validation).items():
        if inspect.isfunction(function) and function.__module__ == _validation.__name__:
            for parameter in inspect.signature(function).parameters:
                assert parameter not in checks and not parameter.endswith("_"), (name, parameter)
