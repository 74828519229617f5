"""Malformed calls, drawn from the primitive table (keras_yoso/ops/_spec.py), through the running
backend's native provider (the TensorFlow op library, the XLA FFI handlers on JAX, the torch.library
ops): every call must raise a clear error (ValueError, or TensorFlow's InvalidArgumentError) that
names an input or attribute of the primitive; none may crash the process or return garbage.

Each case takes a valid call of one primitive (small random shapes) and breaks one thing: an input
of the wrong rank, a dimension that disagrees with another input, an int input where a float one
belongs, codes outside [0, num_buckets), an attribute out of its range. 1,000 cases per provider in
the default run, 10,000 under the slow marker. Reproduce case i: `_case(np.random.default_rng(i))`.
"""

import numpy as np
import pytest

from conftest import BACKEND, CUSTOM_OPS_EXPECTED
from keras_yoso.ops import _dispatch
from keras_yoso.ops import _spec

if not CUSTOM_OPS_EXPECTED:
    pytest.skip("native kernels disabled (KERAS_YOSO_DISABLE_CUSTOM_OPS=1)", allow_module_level=True)

# Attribute values outside the range of each attribute (any one is an error).
BAD_ATTRIBUTES = {"num_buckets": (0, -4, 3, 12, 2 ** 21), "causal": (2, -2, 7), "num_hashes": (0, -1, 2 ** 40, 2 ** 62),
                  "hash_code_len": (0, -2, 31, 64), "epsilon": (-1e-6, -1.0, float("nan"))}
MUTATIONS = ("rank", "dimension", "dtype", "codes", "attribute")


def _valid_call(rng, primitive):
    """(inputs by name as NumPy arrays, attributes by name) of a valid call of `primitive`."""
    b, m, tau, d, w = (int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 4)),
                       int(rng.integers(1, 6)), int(rng.integers(1, 5)))
    nq = int(rng.integers(1, 7))
    nk = nq if primitive.name == "lsh_cumulation_step" else int(rng.integers(1, 7))
    nb = 2 ** tau
    rows = {"x": (b, nq, d), "query": (b, nq, d), "key": (b, nk, d), "value": (b, nk, d),
            "query_weight": (b, nq, w), "key_weight": (b, nk, w), "tables": (b, m, nb, d)}
    if primitive.name == "lower_bound_gradients":
        rows["value"], rows["output_gradient"] = (b, nk, w), (b, nq, w)
    inputs = {}
    for spec in primitive.inputs:
        side = nq if spec.name.startswith("query") else nk
        if spec.kind == "mask":
            inputs[spec.name] = (rng.random((b, side)) > 0.3).astype(np.float32)
        elif spec.kind == "codes":
            inputs[spec.name] = rng.integers(0, nb, (b, m, side)).astype(np.int32)
        elif spec.name == "projection":
            inputs[spec.name] = rng.standard_normal((d, m * tau)).astype(np.float32)
        elif spec.name == "signs":
            padded = 1 << (d - 1).bit_length()
            blocks = max(-(-m * tau // padded), tau)
            inputs[spec.name] = rng.choice(np.array([-1.0, 1.0], np.float32), (blocks, 3, padded))
        else:
            inputs[spec.name] = rng.standard_normal(rows[spec.name]).astype(np.float32)
    attributes = {"num_hashes": m, "hash_code_len": tau, "num_buckets": nb, "causal": 0, "epsilon": 1e-6}
    if primitive.name in ("lsh_cumulation", "weighted_lsh_cumulation", "lower_bound_gradients") and nq == nk:
        attributes["causal"] = int(rng.integers(-1, 2))
    return inputs, {a.name: attributes[a.name] for a in primitive.attributes}


def _case(rng):
    """(primitive, inputs, attributes, what was broken, the names an error may name)."""
    primitive = list(_spec.PRIMITIVES.values())[int(rng.integers(len(_spec.PRIMITIVES)))]
    inputs, attributes = _valid_call(rng, primitive)
    kinds = [k for k in MUTATIONS if k != "codes" or any(t.kind == "codes" for t in primitive.inputs)]
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "attribute" and not attributes:
        kind = "rank"
    names = list(inputs)
    if kind in ("rank", "dimension"):
        name = names[int(rng.integers(len(names)))]
        array = inputs[name]
        inputs[name] = array[..., None] if rng.random() < 0.5 or array.ndim == 1 else array.reshape(array.shape[:-2]
                                                                                                     + (-1,))
        return primitive, inputs, attributes, f"rank of {name}", [name]
    candidates = _shared_dims(primitive, inputs)
    if kind == "dimension" and candidates:
        # A dim that another input shares (batch, length, width, num_hashes, num_buckets) grows by one.
        name, axis = candidates[int(rng.integers(len(candidates)))]
        shape = list(inputs[name].shape)
        shape[axis] += 1
        inputs[name] = np.resize(inputs[name], shape).astype(inputs[name].dtype)
        return primitive, inputs, attributes, f"axis {axis} of {name}", names
    if kind == "dtype":
        # Every provider casts masks, tables, parameters and the other float rows to their dtypes; the
        # input that sets the primitive's float dtype (value, query or x) must be a float.
        name = primitive.float_dtype_source() or "x"
        inputs[name] = inputs[name].astype(np.int32)
        return primitive, inputs, attributes, f"dtype of {name}", [name]
    if kind == "codes":
        codes = [t.name for t in primitive.inputs if t.kind == "codes"]
        name = codes[int(rng.integers(len(codes)))]
        if primitive.name == "lsh_cumulation_step":
            bound = inputs["tables"].shape[2]
        else:
            bound = attributes["num_buckets"] if "num_buckets" in attributes else 2 ** attributes["hash_code_len"]
        inputs[name] = inputs[name].copy()
        inputs[name].flat[int(rng.integers(inputs[name].size))] = (bound, -1, 2 ** 31 - 1)[int(rng.integers(3))]
        return primitive, inputs, attributes, f"codes of {name}", [name]
    name = list(attributes)[int(rng.integers(len(attributes)))]
    choices = BAD_ATTRIBUTES[name]
    attributes[name] = choices[int(rng.integers(len(choices)))]
    return primitive, inputs, attributes, f"attribute {name}", list(attributes) + names


def _shared_dims(primitive, inputs):
    """(input, axis) pairs whose size another input (or a rule: num_buckets a power of two) fixes."""
    if primitive.name.endswith("hash_codes"):  # x's batch and length are free; a Hadamard block pads d
        return [("x", 2)] if primitive.name == "gaussian_hash_codes" else []
    free = {("value", 2)} if primitive.name in ("lsh_cumulation", "weighted_lsh_cumulation") else set()
    return [(n, axis) for n in inputs for axis in range(inputs[n].ndim) if (n, axis) not in free]


def _errors():
    errors = (ValueError,)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        errors += (tf.errors.InvalidArgumentError,)
    return errors


def _run(provider, primitive, inputs, attributes):
    import keras

    tensors = [keras.ops.convert_to_tensor(inputs[t.name]) for t in primitive.inputs]
    return provider.run(primitive.name, *tensors, *(attributes[a.name] for a in primitive.attributes))


def _fuzz(first, count):
    provider, error = _dispatch.native_provider()
    assert provider is not None, error
    failures = []
    for i in range(first, first + count):
        primitive, inputs, attributes, broken, names = _case(np.random.default_rng(i))
        try:
            _run(provider, primitive, inputs, attributes)
        except _errors() as exception:
            message = str(exception)
            if not any(name in message for name in names + ["num_buckets", "causal", "dim", "length", "batch",
                                                            "num_hashes", "width"]):
                failures.append(f"case {i}: {primitive.name} with a bad {broken}: unclear error {message!r}")
            continue
        failures.append(f"case {i}: {primitive.name} with a bad {broken} returned instead of raising")
    assert not failures, "\n".join(failures[:20])


def test_1000_malformed_native_calls_raise_a_clear_error():
    _fuzz(0, 1000)


@pytest.mark.slow
@pytest.mark.parametrize("first", range(1000, 11000, 2500))
def test_10000_malformed_native_calls_raise_a_clear_error(first):
    _fuzz(first, 2500)
