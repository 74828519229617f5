"""Sequence and data parallelism on JAX with 8 virtual CPU devices (keras_yoso.distribution).

Each test runs in a fresh JAX process whose XLA_FLAGS create 8 CPU devices before JAX starts,
whatever backend this pytest runs on. Equality with one device: max abs difference <= 1e-4
(float32) in outputs and gradients (issue 21's target).
"""

import pytest

from conftest import run_python

DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "OMP_NUM_THREADS": "1"}

# Shared by the scripts below: a mesh from "DxS", one-device references, HLO checks.
PRELUDE = """
import contextlib
import re
import jax
import jax.numpy as jnp
import keras
import numpy as np
import keras_yoso
from keras_yoso import ops as yops
from keras_yoso.layers import LinearRelativeAttention, YosoAttention

assert len(jax.devices()) == 8, jax.devices()
TOL = 1e-4


def mesh_of(spec):
    data, seq = (int(n) for n in spec.split("x"))
    return keras.distribution.DeviceMesh((data, seq), ["batch", "seq"], keras.distribution.list_devices())


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(a, b))


def native_shapes(compiled_text):
    # The shapes of every keras_yoso custom call (result and operands) in compiled HLO.
    shapes = []
    for line in compiled_text.splitlines():
        if 'custom_call_target="keras_yoso_' in line:
            head = line.split("custom_call_target")[0]
            shapes += [tuple(int(d) for d in s.split(",") if d) for s in re.findall(r"\\[([0-9,]*)\\]", head)]
    return shapes
"""

OPS_ON_MESH = PRELUDE + """
mesh = mesh_of(MESH)
dist = keras_yoso.distribution.SequenceParallel(mesh)
B, N, d, m, tau, horizon = 4, 64, 6, 3, 3, 3  # distinct dims: the HLO check tells them apart
rng = np.random.default_rng(0)
unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype("float32")
q, k = unit(rng.normal(size=(B, N, d))), unit(rng.normal(size=(B, N, d)))
v = rng.normal(size=(B, N, d)).astype("float32")
rel = rng.normal(size=(2 * horizon + 1, d)).astype("float32")
cotangent = rng.normal(size=(B, N, d)).astype("float32")
mask = np.ones((B, N), bool)
mask[1, N - 5:] = False      # padding at the end of the last shard
mask[3, N - 12:] = False     # and reaching into the one before (1x8, 2x4)


def yoso(impl, causal):
    def f(q, k, v):
        qc = yops.hash_codes(q, m, tau, 7, implementation=impl)
        kc = yops.hash_codes(k, m, tau, 7, implementation=impl)
        return yops.yoso_cumulation(q, k, v, qc, kc, tau, mask, mask, implementation=impl, causal=causal)
    return f


def linear(causal, with_horizon):
    def f(q, k, v):
        return yops.linear_relative_attention(q, k, v, rel if with_horizon else None, horizon if with_horizon else None,
                                              causal, mask, mask, chunk_size=4)
    return f


cases = [("yoso native", yoso("custom_op", False)), ("yoso composite", yoso("composite", False)),
         ("yoso causal native", yoso("custom_op", True)), ("yoso causal composite", yoso("composite", True)),
         ("linear_relative", linear(False, True)), ("linear_relative causal", linear(True, True)),
         ("linear causal, no horizon", linear(True, False))]
for name, f in cases:
    def forward_backward(q, k, v, f=f):
        out, vjp = jax.vjp(f, q, k, v)
        return (out,) + vjp(cotangent)
    want = jax.jit(forward_backward)(q, k, v)
    with dist.scope():
        mapped = jax.jit(lambda q, k, v: forward_backward(q, k, v))   # a new function: traced under the mesh
        got = mapped(q, k, v)
        text = mapped.lower(q, k, v).compile().as_text()
    diff = max_diff(want, got)
    assert diff <= TOL, (name, diff)
    collectives = [c for c in ("all-reduce", "collective-permute", "all-gather") if c in text]
    seq = mesh.shape[1]
    if seq > 1:
        assert collectives, (name, "no collective: the sequence was not split")
    if "native" in name:
        shapes = native_shapes(text)
        assert shapes, name
        # Every native call sees its device's block: N / seq positions, never the whole sequence.
        lengths = {s[-1] for s in shapes if len(s) == 3 and s[1] == m} | {s[1] for s in shapes if len(s) == 3 and s[2] == d}
        assert lengths == {N // seq}, (name, lengths, shapes)
    print(name, "max diff", diff, collectives)

# Cross-attention: 32 queries over the 64 keys (each side in blocks of its own length).
short = q[:, :32]
cross_cases = [
    ("yoso cross", lambda q, k, v: yops.yoso_cumulation(
        q, k, v, yops.hash_codes(q, m, tau, 7), yops.hash_codes(k, m, tau, 7), tau, None, mask)),
    ("linear cross", lambda q, k, v: yops.linear_relative_attention(q, k, v, key_mask=mask)),
    ("linear_relative cross (sequence kept whole)", lambda q, k, v: yops.linear_relative_attention(
        q, k, v, rel, horizon, key_mask=mask))]
for name, f in cross_cases:
    def forward_backward(q, k, v, f=f):
        out, vjp = jax.vjp(f, q, k, v)
        return (out,) + vjp(cotangent[:, :32])
    want = jax.jit(forward_backward)(short, k, v)
    with dist.scope():
        got = jax.jit(lambda q, k, v: forward_backward(q, k, v))(short, k, v)
    assert max_diff(want, got) <= TOL, (name, max_diff(want, got))

# Small limits: the tables in several hash groups (one collective each), positions in several chunks.
from keras_yoso.ops.parallel import yoso_tables
yoso_tables.TABLE_FLOATS_PER_COLLECTIVE, yoso_tables.CHUNK_FLOATS = 2 ** 8, 2 ** 6
for causal in (False, True):
    f = yoso("custom_op", causal)
    def forward_backward(q, k, v, f=f):
        out, vjp = jax.vjp(f, q, k, v)
        return (out,) + vjp(cotangent)
    want = jax.jit(forward_backward)(q, k, v)
    with dist.scope():
        got = jax.jit(lambda q, k, v: forward_backward(q, k, v))(q, k, v)
    assert max_diff(want, got) <= TOL, ("small limits", causal, max_diff(want, got))
print("ops ok")
"""

FIT_ON_MESH = PRELUDE + """
mesh = mesh_of(MESH)
dist = keras_yoso.distribution.SequenceParallel(mesh)
N = 64


def build(kind):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((N,), dtype="int32")
    x = keras.layers.Embedding(32, 16, mask_zero=True)(tokens)
    if kind == "yoso":
        x = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, conv_window=3, seed=3)(x, x)
    elif kind == "yoso causal":
        x = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=3)(x, x, use_causal_mask=True)
    else:
        x = LinearRelativeAttention(2, 8, horizon=3)(x, x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(tokens, keras.layers.Dense(1)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.02), loss="mse")  # a stable step: losses stay O(1)
    return model


rng = np.random.default_rng(0)
tokens = rng.integers(1, 32, size=(16, N)).astype("int32")
tokens[::2, N - 10:] = 0       # padding at the end of the last shard
targets = rng.normal(size=(16, 1)).astype("float32")
for kind in ("yoso", "yoso causal", "linear_relative"):
    results = []
    for distribution in (None, dist):
        with contextlib.nullcontext() if distribution is None else distribution.scope():
            model = build(kind)
            before = model.predict(tokens, batch_size=8, verbose=0)   # batches divide over the 8x1 mesh too
            loss = model.fit(tokens, targets, batch_size=8, epochs=2, shuffle=False, verbose=0).history["loss"]
            evaluated = model.evaluate(tokens, targets, batch_size=8, verbose=0)
            results.append((before, np.array(loss), model.get_weights(), evaluated))
    (p1, l1, w1, e1), (p2, l2, w2, e2) = results
    assert max_diff([p1], [p2]) <= TOL, (kind, "predict", max_diff([p1], [p2]))
    assert max_diff([l1], [l2]) <= TOL, (kind, "loss", l1, l2)
    assert max_diff(w1, w2) <= TOL, (kind, "weights", max_diff(w1, w2))
    assert abs(e1 - e2) <= TOL, (kind, "evaluate", e1, e2)
    print(kind, "fit ok", l1, l2)
print("fit ok")
"""


@pytest.mark.other_backends
@pytest.mark.parametrize("mesh", ["1x8", "2x4", "8x1"])
def test_sequence_parallel_ops_equal_one_device_with_native_calls_per_block(mesh, tmp_path):
    """YOSO (native and composite, bidirectional and causal) and LinearRelative attention: outputs and
    gradients under SequenceParallel equal one device; the native calls get each device's block."""
    output = run_python(f"MESH = {mesh!r}\n" + OPS_ON_MESH, tmp_path, backend="jax", env=DEVICES, timeout=600)
    assert "ops ok" in output, output


@pytest.mark.other_backends
@pytest.mark.parametrize("mesh", ["1x8", "2x4", "8x1"])
def test_model_fit_predict_evaluate_under_sequence_parallel_equal_one_device(mesh, tmp_path):
    """model.predict, two epochs of model.fit (fresh hash functions per step) and model.evaluate of
    YOSO-C, causal YOSO and LinearRelative models give the one-device numbers, padding included."""
    output = run_python(f"MESH = {mesh!r}\n" + FIT_ON_MESH, tmp_path, backend="jax", env=DEVICES, timeout=600)
    assert "fit ok" in output, output


@pytest.mark.other_backends
def test_keras_data_parallel_runs_native_kernels_on_each_batch_shard(tmp_path):
    """Under keras.distribution.DataParallel the native calls are not gathered: each device runs them on
    its batch block (B / 8 rows), and training equals one device."""
    output = run_python(PRELUDE + """
        B, N = 16, 32
        def build():
            keras.utils.set_random_seed(0)
            tokens = keras.Input((N,), dtype="int32")
            x = keras.layers.Embedding(32, 16)(tokens)
            x = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=3, implementation="custom_op")(x, x)
            x = LinearRelativeAttention(2, 8, horizon=3)(x, x)
            model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(x)))
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            return model
        rng = np.random.default_rng(0)
        tokens = rng.integers(1, 32, size=(B, N)).astype("int32")
        targets = rng.normal(size=(B, 1)).astype("float32")
        reference = build()
        want = reference.fit(tokens, targets, batch_size=B, epochs=3, shuffle=False, verbose=0).history["loss"]
        dist = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
        with dist.scope():
            model = build()
            got = model.fit(tokens, targets, batch_size=B, epochs=3, shuffle=False, verbose=0).history["loss"]
            state = [v.value for v in model.trainable_variables]
            fn = jax.jit(lambda s, x: model.stateless_call(s, [v.value for v in model.non_trainable_variables], x)[0])
            text = fn.lower(state, jnp.asarray(tokens)).compile().as_text()
        assert max_diff([want], [got]) <= TOL, (want, got)
        assert max_diff(reference.get_weights(), model.get_weights()) <= TOL
        shapes = native_shapes(text)
        rows = {s[0] for s in shapes if len(s) == 3}
        assert rows == {B * 2 // 8}, (rows, shapes)  # batch x heads rows per device: 32 / 8
        print("data parallel ok")
    """.replace("\n        ", "\n"), tmp_path, backend="jax", env=DEVICES, timeout=600)
    assert "data parallel ok" in output, output


@pytest.mark.other_backends
def test_sequence_parallel_rejects_bad_lengths_and_meshes_naming_the_numbers(tmp_path):
    output = run_python(PRELUDE + """
        import pytest
        mesh = mesh_of("2x4")
        dist = keras_yoso.distribution.SequenceParallel(mesh)
        assert dist.sequence_dim_name == "seq" and dist.batch_dim_name == "batch"
        assert dist.get_data_layout((8, 64)).axes == ("batch", "seq")
        assert dist.get_data_layout((8, 2)).axes == ("batch", None)        # [B, classes] labels stay whole
        assert dist.get_data_layout((8,)).axes == ("batch",)
        assert isinstance(dist, keras.distribution.ModelParallel)
        layer = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=1)
        x = np.zeros((2, 66, 16), "float32")
        with dist.scope():
            with pytest.raises(ValueError, match=r"66.*4|4.*66"):
                layer(x, x)
            linear = LinearRelativeAttention(2, 8, horizon=5)
            with pytest.raises(ValueError, match="horizon=5"):
                linear(np.zeros((2, 16, 16), "float32"), np.zeros((2, 16, 16), "float32"))   # 4 per device < 5
        with pytest.raises(ValueError, match="sequence_dim_name='sequence'"):
            keras_yoso.distribution.SequenceParallel(mesh, sequence_dim_name="sequence")
        with pytest.raises(ValueError, match="two different"):
            keras_yoso.distribution.SequenceParallel(mesh, batch_dim_name="seq")
        # Outside the distribution the same layer runs as always (any length).
        assert layer(x, x).shape == (2, 66, 16)

        # layout_map: a variable it names is sharded as it says, the others stay replicated.
        layout_map = keras.distribution.LayoutMap(mesh)
        layout_map[".*ffn.*kernel"] = (None, "seq")
        with keras_yoso.distribution.SequenceParallel(mesh, layout_map=layout_map).scope():
            tokens = keras.Input((32,), dtype="int32")
            h = YosoAttention(2, 8, num_hashes=4, hash_code_len=3, seed=3)(*[keras.layers.Embedding(32, 16)(tokens)] * 2)
            h = keras.layers.Dense(32, name="ffn")(h)
            model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
            model.compile(optimizer="sgd", loss="mse")
            loss = model.fit(np.ones((8, 32), "int32"), np.zeros((8, 1)), batch_size=8, verbose=0).history["loss"]
            specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
        assert np.isfinite(loss).all(), loss
        assert specs["ffn/kernel"] == (None, "seq"), specs
        assert all(not any(spec) for path, spec in specs.items() if path != "ffn/kernel"), specs
        print("errors ok")
    """.replace("\n        ", "\n"), tmp_path, backend="jax", env=DEVICES, timeout=300)
    assert "errors ok" in output, output


def test_sequence_parallel_on_another_backend_says_it_needs_jax(tmp_path):
    output = run_python("""
        import keras, pytest
        import keras_yoso
        mesh = keras.distribution.DeviceMesh((1, 1), ["batch", "seq"], keras.distribution.list_devices()[:1])
        with pytest.raises(ValueError, match="JAX backend.*KERAS_BACKEND=tensorflow"):
            keras_yoso.distribution.SequenceParallel(mesh)
        print("needs jax ok")
    """, tmp_path, backend="tensorflow")
    assert "needs jax ok" in output, output


@pytest.mark.other_backends
def test_a_batch_that_does_not_divide_the_batch_axis_raises_naming_the_batch_and_the_axis(tmp_path):
    output = run_python(PRELUDE + """
        import pytest
        dist = keras_yoso.distribution.SequenceParallel(mesh_of("4x2"))
        message = r"batch of 6 rows .*over the 'batch' axis of the device mesh \\(4 devices\\).*multiple of 4, received 6"
        with pytest.raises(ValueError, match=message):
            dist.get_data_layout((6, 16, 8))
        with pytest.raises(ValueError, match=message.replace("6 rows", "6 rows \\\\(an input of shape \\\\(6,\\\\)\\\\)")):
            dist.get_data_layout((6,))                                    # labels too
        assert dist.get_data_layout((None, 16)).axes == ("batch", "seq")  # unknown batch: laid out as always
        with dist.scope():
            tokens = keras.Input((16,), dtype="int32")
            h = keras.layers.Embedding(32, 8)(tokens)
            h = YosoAttention(2, 4, num_hashes=2, hash_code_len=3, seed=1)(h, h)
            model = keras.Model(tokens, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))
            model.compile(optimizer="sgd", loss="mse")
            x, y = np.ones((12, 16), "int32"), np.zeros((12, 1), "float32")
            assert model.predict(x, batch_size=4, verbose=0).shape == (12, 1)
            with pytest.raises(ValueError, match=message):
                model.predict(x, batch_size=6, verbose=0)
            with pytest.raises(ValueError, match=message):
                model.fit(x, y, batch_size=6, verbose=0)                  # not JAX's raw IndivisibleError
        print("batch errors ok")
    """.replace("\n        ", "\n"), tmp_path, backend="jax", env=DEVICES, timeout=300)
    assert "batch errors ok" in output, output
