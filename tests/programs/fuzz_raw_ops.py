"""Fuzz driver for the raw keras-yoso ops; tests/test_tf_fuzz_raw_ops.py runs it in subprocesses.

Case `i` of seed `s` is drawn from np.random.default_rng([s, i]): one of the five raw ops of
the loaded library, a consistent set of shapes, attributes and inputs, then zero or more
mutations — a bad attribute (zero, negative, not a power of two, huge), a wrong rank or
dimension, a huge dimension on an empty tensor, codes outside [0, num_buckets) (negative,
INT32_MIN/MAX), NaN/Inf in float inputs, odd mask values (NaN, negative, fractions). The case
runs eagerly, or in a `tf.function` traced with static shapes, or with an input signature
whose dims are partly unknown (so the kernel, not the shape function, sees the bad shape).

The contract checked for every case:
- the op raises `tf.errors.InvalidArgumentError`, or `ValueError` while the graph is built; or
- it returns an output of the expected shape and dtype, in which
  * hash codes lie in [0, 2**hash_code_len) and a row of x holding NaN hashes to code 0;
  * masked queries output exactly 0;
  * an output row is non-finite only where a non-finite input reaches it (a kept key that
    collides with the query, or the query's own weight/vector); every other row is finite
    and matches a float64 reference.
Anything else — another exception, a wrong output — prints "FAIL case <i> ..." and the driver
exits with status 1. A crash kills the process; the last "case <i>" line names the case.

Reproduce one case:  python tests/programs/fuzz_raw_ops.py --seed S --first I --count 1 --verbose
"""

import argparse
import math
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_yoso.ops.providers import tensorflow as tf_provider  # noqa: E402

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1
# Huge sizes, only ever given to a dimension of a tensor that has another dimension 0.
HUGE_DIMS = (2 ** 31 - 1, 2 ** 31, 2 ** 31 + 1, 2 ** 32, 2 ** 40, 2 ** 62, INT64_MAX)
BAD_NUM_BUCKETS = (0, -1, 3, 6, 12, 2 ** 21, 2 ** 40, -(2 ** 63), INT64_MAX)
BAD_HASH_CODE_LEN = (0, -1, 31, 32, 63, 64, 2 ** 40, INT64_MAX)
BAD_COLLISION_HASH_CODE_LEN = (0, -3, 21, 30, 31, 2 ** 40)
BAD_NUM_HASHES = (0, -1, 2 ** 31, 2 ** 40, 2 ** 61, 2 ** 62, INT64_MAX)
EPSILONS = (1e-6, 1e-6, 1e-6, 0.0, 1.0, -1e-6, float("nan"), float("inf"))
# Outputs with more elements than this (but few enough to fit int64) are not drawn: the
# allocator, not the op, would answer them (ResourceExhaustedError or the OOM killer).
MAX_OUTPUT_ELEMENTS = 2 ** 22
DTYPES = (tf.float32, tf.float16, tf.bfloat16)
# The fuzzed ops; Case.inputs lists an op's inputs in the order of its signature.
OPS = ("YosoGaussianHashCodes", "YosoHadamardHashCodes", "YosoLshCumulation", "YosoWeightedLshCumulation",
       "YosoCollisionCumulation")
# Relative tolerance of an output against the float64 reference, scaled by the sum of |terms|.
RTOL = {tf.float32: 1e-4, tf.float16: 4e-3, tf.bfloat16: 2e-2}


class Case:
    """One drawn case: op name, ordered inputs (name -> (shape, dtype, numpy or None)), attrs."""

    def __init__(self, op, inputs, attrs, dtype):
        self.op, self.inputs, self.attrs, self.dtype = op, inputs, attrs, dtype
        self.mode = "eager"
        self.mutations = []

    def describe(self):
        shapes = ", ".join(f"{name}{list(shape)}" for name, (shape, _, _) in self.inputs.items())
        return (f"{self.op} {self.mode} T={self.dtype.name} attrs={self.attrs} mutations={self.mutations} "
                f"inputs: {shapes}")


def _codes(rng, shape, num_buckets):
    high = max(1, min(num_buckets, 2 ** 20)) if num_buckets > 0 else 1
    return rng.integers(0, high, size=shape).astype(np.int32)


def _floats(rng, shape):
    return rng.normal(size=shape).astype(np.float32)


def _mask(rng, shape):
    return (rng.random(shape) > 0.3).astype(np.float32)


def _draw_valid(rng):
    """A valid case: consistent shapes, codes in range, finite inputs."""
    op = str(rng.choice(OPS))
    dtype = DTYPES[rng.integers(len(DTYPES))]
    batch = int(rng.choice([0, 1, 1, 2, 2, 3]))
    num_hashes = int(rng.integers(1, 4))
    nq, nk = (int(rng.choice([0, 1, 2, 3, 5, 8, 13])) for _ in range(2))
    width = lambda: int(rng.choice([0, 1, 2, 3, 5, 8]))  # noqa: E731
    floats = lambda *shape: (shape, dtype, _floats(rng, shape))  # noqa: E731
    if op.endswith("HashCodes"):
        tau = int(rng.integers(1, 31)) if rng.random() < 0.2 else int(rng.integers(1, 9))
        dim = int(rng.integers(1, 10))
        bits = num_hashes * tau
        inputs = {"x": floats(batch, nq, dim)}
        if op == "YosoGaussianHashCodes":
            inputs["projection"] = ((dim, bits), tf.float32, _floats(rng, (dim, bits)))
        else:
            padded = 1 << math.ceil(math.log2(dim))
            blocks = -(-bits // padded)
            signs = (2 * rng.integers(0, 2, size=(blocks, 3, padded)) - 1).astype(np.float32)
            inputs["signs"] = ((blocks, 3, padded), tf.float32, signs)
        return Case(op, inputs, dict(num_hashes=num_hashes, hash_code_len=tau), dtype)
    tau = int(rng.integers(1, 21)) if rng.random() < 0.2 else int(rng.integers(1, 5))
    codes = lambda n: ((batch, num_hashes, n), tf.int32, _codes(rng, (batch, num_hashes, n), 2 ** tau))  # noqa: E731
    inputs = {"query_mask": ((batch, nq), tf.float32, _mask(rng, (batch, nq))), "query_codes": codes(nq)}
    if op == "YosoWeightedLshCumulation":
        w = width()
        inputs["query_weight"] = floats(batch, nq, w)
    elif op == "YosoCollisionCumulation":
        dim, w = width(), width()
        inputs.update(query=floats(batch, nq, dim), query_weight=floats(batch, nq, w))
    inputs.update(key_mask=((batch, nk), tf.float32, _mask(rng, (batch, nk))), key_codes=codes(nk))
    if op == "YosoLshCumulation":
        inputs["value"] = floats(batch, nk, width())
        attrs = dict(num_buckets=2 ** tau)
    elif op == "YosoWeightedLshCumulation":
        inputs.update(key_weight=floats(batch, nk, w), value=floats(batch, nk, width()))
        attrs = dict(num_buckets=2 ** tau)
    else:
        inputs.update(key=floats(batch, nk, dim), key_weight=floats(batch, nk, w))
        attrs = dict(hash_code_len=tau, epsilon=float(EPSILONS[rng.integers(len(EPSILONS))]))
    return Case(op, inputs, attrs, dtype)


def _reshape_input(rng, case, name, shape):
    """Replaces input `name` by fresh data of `shape` (no data for an empty tensor: zeros)."""
    _, dtype, _ = case.inputs[name]
    shape = tuple(int(s) for s in shape)
    if 0 in shape:
        data = None
    elif dtype == tf.int32:
        data = _codes(rng, shape, case.attrs.get("num_buckets", 2))
    elif name.endswith("mask"):
        data = _mask(rng, shape)
    else:
        data = _floats(rng, shape)
    case.inputs[name] = (shape, dtype, data)


def _mutate_attr(rng, case):
    if "num_buckets" in case.attrs:
        case.attrs["num_buckets"] = int(rng.choice(BAD_NUM_BUCKETS))
    elif case.op == "YosoCollisionCumulation":
        if rng.random() < 0.5:
            case.attrs["hash_code_len"] = int(rng.choice(BAD_COLLISION_HASH_CODE_LEN))
        else:
            case.attrs["epsilon"] = float(rng.choice([-1.0, float("nan"), -float("inf")]))
    elif rng.random() < 0.5:
        case.attrs["hash_code_len"] = int(rng.choice(BAD_HASH_CODE_LEN))
    else:
        case.attrs["num_hashes"] = int(rng.choice(BAD_NUM_HASHES))


def _mutate_shape(rng, case):
    name = list(case.inputs)[rng.integers(len(case.inputs))]
    shape = list(case.inputs[name][0])
    kind = rng.choice(["rank", "dim", "dim", "huge"])
    if kind == "rank" or not shape:
        if shape and rng.random() < 0.5:
            shape.pop(int(rng.integers(len(shape))))
        else:
            shape.insert(int(rng.integers(len(shape) + 1)), int(rng.choice([1, 2])))
    elif kind == "dim":
        axis = int(rng.integers(len(shape)))
        shape[axis] = int(rng.choice([0, 1, 2, 3, 4, 7, 16]))
    else:
        zero_axis, huge_axis = rng.permutation(len(shape))[:2] if len(shape) > 1 else (0, 0)
        if zero_axis == huge_axis:
            shape[zero_axis] = 0
        else:
            # TensorFlow rejects shapes whose nonzero dims multiply past int64, even with a 0 dim.
            shape[zero_axis] = 0
            rest = math.prod(s for i, s in enumerate(shape) if i != huge_axis and s > 0)
            shape[huge_axis] = int(min(rng.choice(HUGE_DIMS), INT64_MAX // rest))
    _reshape_input(rng, case, name, shape)
    return f"{kind}:{name}"


def _mutate_codes(rng, case):
    names = [n for n in case.inputs if n.endswith("codes") and case.inputs[n][2] is not None
             and case.inputs[n][2].size]
    if not names:
        return None
    name = names[rng.integers(len(names))]
    codes = case.inputs[name][2].copy().reshape(-1)
    bad = [-1, -2, INT32_MIN, INT32_MAX, 2 ** 20, 2 ** 21, int(rng.integers(INT32_MIN, INT32_MAX))]
    nb = case.attrs.get("num_buckets", 2 ** min(case.attrs.get("hash_code_len", 1), 30))
    if 0 < nb <= INT32_MAX:
        bad.append(int(nb))
    positions = rng.integers(codes.size, size=int(rng.integers(1, codes.size + 1)))
    codes[positions] = rng.choice(bad, size=positions.size)
    shape, dtype, _ = case.inputs[name]
    case.inputs[name] = (shape, dtype, codes.reshape(shape).astype(np.int32))
    return f"codes:{name}"


def _mutate_nonfinite(rng, case):
    names = [n for n, (_, dtype, data) in case.inputs.items()
             if dtype.is_floating and not n.endswith("mask") and data is not None and data.size]
    if not names:
        return None
    name = names[rng.integers(len(names))]
    data = case.inputs[name][2].copy().reshape(-1)
    positions = rng.integers(data.size, size=int(rng.integers(1, min(data.size, 4) + 1)))
    data[positions] = rng.choice([np.nan, np.inf, -np.inf], size=positions.size)
    shape, dtype, _ = case.inputs[name]
    case.inputs[name] = (shape, dtype, data.reshape(shape))
    return f"nonfinite:{name}"


def _mutate_mask(rng, case):
    names = [n for n in case.inputs if n.endswith("mask") and case.inputs[n][2] is not None
             and case.inputs[n][2].size]
    if not names:
        return None
    name = names[rng.integers(len(names))]
    shape, dtype, data = case.inputs[name]
    odd = rng.choice([np.nan, -1.0, 0.5, -0.0, 1e-30, np.inf], size=data.shape).astype(np.float32)
    case.inputs[name] = (shape, dtype, np.where(rng.random(data.shape) < 0.5, odd, data))
    return f"mask:{name}"


def _output_shape(case):
    """The output shape the kernel would allocate if every check passed (None: rank too wrong)."""
    shapes = {name: shape for name, (shape, _, _) in case.inputs.items()}
    try:
        if "x" in shapes:
            return (shapes["x"][0], case.attrs["num_hashes"], shapes["x"][1])
        width = shapes["query"][2] if case.op == "YosoCollisionCumulation" else shapes["value"][2]
        return (shapes["query_codes"][0], shapes["query_codes"][2], width)
    except (IndexError, KeyError):
        return None


def draw_case(seed, index):
    rng = np.random.default_rng([seed, index])
    case = _draw_valid(rng)
    mutators = [(0.2, _mutate_attr), (0.35, _mutate_shape), (0.35, _mutate_codes),
                (0.3, _mutate_nonfinite), (0.15, _mutate_mask)]
    for probability, mutate in mutators:
        if rng.random() < probability:
            label = mutate(rng, case)
            case.mutations.append(label or mutate.__name__[len("_mutate_"):])
    shape = _output_shape(case)
    if shape is not None and MAX_OUTPUT_ELEMENTS < math.prod(shape) <= INT64_MAX:
        # Too big to allocate but representable: shrink every huge dim back to 0.
        for name, (shp, dtype, data) in list(case.inputs.items()):
            if any(s > 2 ** 20 for s in shp):
                case.inputs[name] = (tuple(0 if s > 2 ** 20 else s for s in shp), dtype, None)
        if case.attrs.get("num_hashes", 0) > 2 ** 20:
            case.attrs["num_hashes"] = 2
        case.mutations.append("shrunk")
    mode = rng.random()
    case.mode = "eager" if mode < 0.86 else ("graph_static" if mode < 0.93 else "graph_unknown")
    return case, rng


def _tensor(shape, dtype, data):
    if data is None:
        return tf.zeros(shape, dtype)
    return tf.cast(tf.constant(data), dtype)


def _op_function(op):
    name = "".join("_" + c.lower() if c.isupper() else c for c in op).lstrip("_")
    return getattr(tf_provider.library(), name)


def run_case(case, rng):
    """Runs the case: ("ok", output), ("invalid", message) or ("graph_error", message).

    Float inputs in case.inputs are replaced by their values after rounding to the op's dtype,
    which is what the kernel sees and what the checks compare against.
    """
    fn = _op_function(case.op)
    tensors = [_tensor(*spec) for spec in case.inputs.values()]
    for (name, (shape, dtype, data)), t in zip(list(case.inputs.items()), tensors):
        if data is not None and dtype.is_floating:
            case.inputs[name] = (shape, dtype, tf.cast(t, tf.float32).numpy())
    attrs = case.attrs
    try:
        if case.mode == "eager":
            return "ok", fn(*tensors, **attrs)
        if case.mode == "graph_static":
            specs = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
        else:
            specs = [tf.TensorSpec(None, t.dtype) if rng.random() < 0.1 else
                     tf.TensorSpec([None if rng.random() < 0.6 else d for d in t.shape], t.dtype)
                     for t in tensors]
        graph_fn = tf.function(lambda *args: fn(*args, **attrs), input_signature=specs, autograph=False)
        try:
            concrete = graph_fn.get_concrete_function()
        except ValueError as err:
            return "graph_error", str(err).splitlines()[0]
        return "ok", concrete(*tensors)
    except tf.errors.InvalidArgumentError as err:
        return "invalid", err.message.splitlines()[0]


def _nonfinite_rows(data):
    """[B, N, F] -> [B, N] bool: the row holds a NaN or Inf."""
    return ~np.isfinite(data).all(-1) if data.shape[-1] else np.zeros(data.shape[:2], bool)


def check_output(case, out):
    """Raises AssertionError when a successful output breaks the contract."""
    shapes = {name: shape for name, (shape, _, _) in case.inputs.items()}
    expect_shape = _output_shape(case)
    expect_dtype = tf.int32 if "x" in shapes else case.dtype
    assert tuple(out.shape) == expect_shape and out.dtype == expect_dtype, \
        f"output {out.shape} {out.dtype.name} != {expect_shape} {expect_dtype.name}"
    if out.shape.num_elements() == 0:
        return
    values = {name: (np.zeros(shape) if data is None else data) for name, (shape, _, data) in case.inputs.items()}
    if "x" in values:
        codes = out.numpy().astype(np.int64)
        assert codes.min() >= 0 and codes.max() < 2 ** case.attrs["hash_code_len"], \
            f"codes outside [0, 2**tau): min {codes.min()} max {codes.max()}"
        params = values["projection"] if "projection" in values else values["signs"]
        if np.isfinite(params).all():
            nan_rows = np.isnan(values["x"]).any(-1)  # [B, N]
            assert (codes.transpose(0, 2, 1)[nan_rows] == 0).all(), "a row with NaN did not hash to code 0"
        return
    qm, km = values["query_mask"] != 0, values["key_mask"] != 0
    qc, kc = values["query_codes"], values["key_codes"]
    m = qc.shape[1]
    collide = (qc[:, :, :, None] == kc[:, :, None, :]).any(1) & qm[:, :, None] & km[:, None, :]
    counts = (qc[:, :, :, None] == kc[:, :, None, :]).sum(1) * qm[:, :, None] * km[:, None, :]
    if case.op == "YosoLshCumulation":
        v = values["value"].astype(np.float64)
        bad_key, bad_query = _nonfinite_rows(v), np.zeros(qm.shape, bool)
        pair = counts / m
        terms_value, terms_abs = v, np.abs(v)
    elif case.op == "YosoWeightedLshCumulation":
        qw, kw = values["query_weight"].astype(np.float64), values["key_weight"].astype(np.float64)
        v = values["value"].astype(np.float64)
        bad_key = _nonfinite_rows(v) | _nonfinite_rows(kw)
        bad_query = _nonfinite_rows(qw)
        fq, fk = np.where(np.isfinite(qw), qw, 0), np.where(np.isfinite(kw), kw, 0)
        pair = counts / m * np.einsum("biw,bjw->bij", fq, fk)
        pair_abs = counts / m * np.einsum("biw,bjw->bij", np.abs(fq), np.abs(fk))
        terms_value, terms_abs = v, np.abs(v)
    else:
        q, k = values["query"].astype(np.float64), values["key"].astype(np.float64)
        qw, kw = values["query_weight"].astype(np.float64), values["key_weight"].astype(np.float64)
        bad_key = _nonfinite_rows(k) | _nonfinite_rows(kw)
        bad_query = (_nonfinite_rows(q) | _nonfinite_rows(qw)) & collide.any(-1)
        fq, fk = np.where(np.isfinite(q), q, 0), np.where(np.isfinite(k), k, 0)
        x = np.clip(np.einsum("bid,bjd->bij", fq, fk), -1.0, 1.0)
        eps, tau = case.attrs["epsilon"], case.attrs["hash_code_len"]
        with np.errstate(all="ignore"):
            deriv = tau * (1 - np.arccos(x) / np.pi) ** (tau - 1) / (np.pi * np.sqrt(1 - x * x + eps))
        # Near |x| = 1 the derivative amplifies the float32 rounding of x (to infinity when
        # epsilon = 0): those rows are checked for finiteness only (when epsilon > 0).
        sensitive = (collide & (np.abs(x) > 0.999)).any(-1)
        if eps == 0:
            bad_query = bad_query | sensitive
        deriv = np.where(np.isfinite(deriv), deriv, 0.0)
        g = np.einsum("biw,bjw->bij", np.where(np.isfinite(qw), qw, 0), np.where(np.isfinite(kw), kw, 0))
        g_abs = np.einsum("biw,bjw->bij", np.abs(np.where(np.isfinite(qw), qw, 0)),
                          np.abs(np.where(np.isfinite(kw), kw, 0)))
        pair = collide * g * deriv
        pair_abs = collide * g_abs * deriv
        terms_value, terms_abs = fk, np.abs(fk)
    got = tf.cast(out, tf.float32).numpy().astype(np.float64)
    assert (got[~qm] == 0).all(), "a masked query has a nonzero output"
    may_be_nonfinite = qm & ((collide & bad_key[:, None, :]).any(-1) | bad_query)
    finite_rows = ~may_be_nonfinite
    assert np.isfinite(got[finite_rows]).all(), \
        "non-finite output in a row that no non-finite input reaches"
    terms_value = np.where(np.isfinite(terms_value), terms_value, 0)
    terms_abs = np.where(np.isfinite(terms_abs), terms_abs, 0)
    if case.op == "YosoLshCumulation":
        expect = np.einsum("bij,bjd->bid", pair, terms_value)
        scale = np.einsum("bij,bjd->bid", pair, terms_abs)
    else:
        expect = np.einsum("bij,bjd->bid", pair, terms_value)
        scale = np.einsum("bij,bjd->bid", pair_abs, terms_abs)
    tolerance = RTOL[case.dtype] * scale + 1e-6
    if case.op == "YosoCollisionCumulation":
        finite_rows = finite_rows & ~sensitive
    error = np.abs(got - expect)[finite_rows]
    assert (error <= tolerance[finite_rows]).all(), \
        f"output differs from the float64 reference by up to {error.max() if error.size else 0}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if tf_provider.library() is None:
        print(f"SKIP custom ops not loaded: {tf_provider.load_error()}")
        return 0
    tally = {}
    for index in range(args.first, args.first + args.count):
        case, rng = draw_case(args.seed, index)
        print(f"case {index} {case.op} {case.mode}", flush=True)
        try:
            result = run_case(case, rng)
            if result[0] == "ok":
                check_output(case, result[1])
            outcome = result[0]
            detail = "" if outcome == "ok" else result[1]
        except Exception:  # noqa: BLE001 - any other exception breaks the contract
            print(f"FAIL case {index} seed {args.seed}: {case.describe()}\n{traceback.format_exc()}", flush=True)
            return 1
        tally[outcome] = tally.get(outcome, 0) + 1
        if args.verbose:
            print(f"  {case.describe()}\n  -> {outcome} {detail}", flush=True)
    print("done " + " ".join(f"{k}={v}" for k, v in sorted(tally.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
