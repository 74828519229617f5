"""One package on three backends: a `.keras` file saved under one backend loads and gives the same
outputs under another, and keras_yoso imports and runs where TensorFlow cannot be imported.

These tests start interpreters on the other backends themselves, so they run once, from the
TensorFlow run of the suite; they are marked `other_backends` and skip where JAX or PyTorch is not
installed (the README's test command); CI runs them in the venv that has all three (.ci/run).
"""

import pytest

from conftest import TENSORFLOW, run_python

pytestmark = pytest.mark.skipif(not TENSORFLOW, reason="runs once, from the TensorFlow run (it starts the others)")

# A model with every layer of the package; inference hashing is a fixed function of the seeds.
_BUILD_AND_SAVE = """
    import keras
    import numpy as np
    import keras_yoso

    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 32, mask_zero=True)(tokens)
    x = keras_yoso.TransformerEncoderBlock(2, 64, attention="yoso", attention_kwargs=dict(num_hashes=16,
                                           hash_code_len=6, conv_window=3, seed=11))(x)
    x = keras_yoso.TransformerEncoderBlock(2, 64, attention="linear_relative", attention_kwargs=dict(horizon=4))(x)
    x = x + keras_yoso.YosoAttention(2, 16, num_hashes=8, hash_code_len=4, seed=5)(x, x)
    model = keras.Model(tokens, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling1D()(x)))
    data = np.random.default_rng(1).integers(1, 50, size=(4, 40)).astype("int32")
    data[1, 25:] = 0
    np.save("tokens.npy", data)
    np.save("expected.npy", keras.ops.convert_to_numpy(model(data)))
    model.save("model.keras")
    print(keras.backend.backend(), keras_yoso.ops.implementation_in_use())
"""

_LOAD_AND_COMPARE = """
    import keras
    import numpy as np
    import keras_yoso

    model = keras.saving.load_model("model.keras")
    out = keras.ops.convert_to_numpy(model(np.load("tokens.npy")))
    expected = np.load("expected.npy")
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
    print(keras.backend.backend(), keras_yoso.ops.implementation_in_use(), float(np.abs(out - expected).max()))
"""


@pytest.mark.other_backends
# Each backend saves once and loads once here; the compiled-model test below runs the opposite cycle, so the
# two tests cover all six (saving, loading) pairs, each in one interpreter pair (about 40 s in CI).
@pytest.mark.parametrize("saved_on, loaded_on", [("tensorflow", "jax"), ("jax", "torch"), ("torch", "tensorflow")])
def test_keras_file_saved_on_one_backend_gives_the_same_outputs_on_another(saved_on, loaded_on, tmp_path):
    run_python(_BUILD_AND_SAVE, tmp_path, backend=saved_on)
    run_python(_LOAD_AND_COMPARE, tmp_path, backend=loaded_on)


def _hide_packages(folder, names):
    """Stub packages in `folder` (first on sys.path of a `python -c` run there) whose import fails as an
    uninstalled package's would."""
    for name in names:
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}' (hidden by the test)\", name={name!r})\n")


def _hide_tensorflow(folder):
    _hide_packages(folder, ("tensorflow", "tensorflow_text"))


@pytest.mark.other_backends
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_yoso_imports_and_trains_without_tensorflow(backend, tmp_path):
    _hide_tensorflow(tmp_path)
    output = run_python("""
    import sys
    import keras
    import numpy as np
    import keras_yoso
    from keras_yoso import ops

    assert "tensorflow" not in sys.modules
    # The native library links to no framework: JAX and PyTorch run its kernels without TensorFlow.
    assert ops.custom_ops_available() and ops.implementation_in_use() == "custom_op", ops.custom_ops_load_error()
    out = ops.lsh_cumulation(np.zeros((1, 2, 3), "int32"), np.zeros((1, 2, 3), "int32"),
                             np.ones((1, 3, 2), "float32"), 4, implementation="custom_op")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), np.full((1, 3, 2), 3.0))
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(20, 16, mask_zero=True)(tokens)
    x = keras_yoso.TransformerEncoderBlock(2, 32, attention_kwargs=dict(num_hashes=4, hash_code_len=4))(x)
    model = keras.Model(tokens, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x)))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = np.random.default_rng(0).integers(1, 20, size=(8, 12)).astype("int32")
    history = model.fit(data, np.arange(8) % 2, batch_size=4, epochs=1, verbose=0)
    assert "tensorflow" not in sys.modules
    print("ok", keras.backend.backend(), history.history["loss"])
    """, tmp_path, backend=backend)
    assert output.startswith(f"ok {backend}")


def test_custom_op_and_composite_layers_agree_within_float_tolerance(tmp_path):
    """The same YosoAttention weights on TensorFlow's custom op and on its composite (what a model
    exported for portable serving runs)."""
    output = run_python("""
        import keras
        import numpy as np
        from keras_yoso import YosoAttention

        x = np.random.default_rng(2).normal(size=(2, 64, 32)).astype("float32")
        custom = YosoAttention(4, 16, num_hashes=16, hash_code_len=6, conv_window=3, seed=3, implementation="custom_op")
        portable = YosoAttention.from_config({**custom.get_config(), "implementation": "composite"})
        out = keras.ops.convert_to_numpy(custom(x, x))
        portable.build(x.shape, x.shape)
        portable.set_weights(custom.get_weights())
        np.testing.assert_allclose(keras.ops.convert_to_numpy(portable(x, x)), out, rtol=1e-4, atol=1e-5)
        print("ok")
    """, tmp_path)
    assert output.strip() == "ok"


@pytest.mark.other_backends
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_missing_native_library_warns_once_and_runs_the_composite(backend, tmp_path):
    """Without the native library, JAX and PyTorch warn once, "auto" runs the composite, and
    "custom_op" raises RuntimeError with the reason."""
    output = run_python("""
    import warnings
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        import numpy as np
        from keras_yoso import ops
        assert ops.implementation_in_use() == "composite"
        out = ops.lsh_cumulation(np.zeros((1, 2, 3), "int32"), np.zeros((1, 2, 3), "int32"),
                                 np.ones((1, 3, 2), "float32"), 4)
        ops.implementation_in_use()
    messages = [str(w.message) for w in caught if "native kernels are not available" in str(w.message)]
    assert len(messages) == 1, messages
    assert "KERAS_YOSO_DISABLE_CUSTOM_OPS=1" in messages[0], messages[0]
    try:
        ops.lsh_cumulation(np.zeros((1, 2, 3), "int32"), np.zeros((1, 2, 3), "int32"), np.ones((1, 3, 2), "float32"),
                           4, implementation="custom_op")
    except RuntimeError as error:
        assert "native kernels are not loaded" in str(error), error
    else:
        raise AssertionError("custom_op without the native library must raise")
    print("ok")
    """, tmp_path, backend=backend, env={"KERAS_YOSO_DISABLE_CUSTOM_OPS": "1"})
    assert output.strip() == "ok"


_COMPILE_TRAIN_AND_SAVE = """
    import json
    import zipfile

    import keras
    import numpy as np
    from keras_yoso.models import CausalLM

    keras.utils.set_random_seed(0)
    model = CausalLM(50, 16, hidden_dim=16, num_layers=1, num_heads=2, intermediate_dim=16,
                     attention_kwargs=dict(num_hashes=4, hash_code_len=4, seed=3))
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    tokens = np.random.default_rng(0).integers(0, 50, (4, 9)).astype("int32")
    model.fit(tokens[:, :-1], tokens[:, 1:], epochs=1, verbose=0)
    np.save("tokens.npy", tokens)
    np.save("expected.npy", keras.ops.convert_to_numpy(model(tokens)))
    np.savez("optimizer.npz", *[keras.ops.convert_to_numpy(v) for v in model.optimizer.variables])
    model.save("model.keras")
    optimizer = json.loads(zipfile.ZipFile("model.keras").read("config.json"))["compile_config"]["optimizer"]
    print(optimizer["module"], optimizer["class_name"], optimizer["registered_name"])
"""

_LOAD_COMPILED_AND_TRAIN = """
    import sys

    import keras
    import numpy as np
    import keras_yoso

    model = keras.saving.load_model("../model.keras")
    assert model.compiled and isinstance(model.optimizer, keras.optimizers.Adam), type(model.optimizer)
    tokens = np.load("../tokens.npy")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(tokens)), np.load("../expected.npy"), atol=1e-5)
    saved = np.load("../optimizer.npz")
    saved = [saved[f"arr_{k}"] for k in range(len(saved.files))]
    assert len(model.optimizer.variables) == len(saved)
    for variable, value in zip(model.optimizer.variables, saved):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(variable), value, atol=1e-7, err_msg=variable.path)
    # A file from JAX carries jit_compile=True; torch.compile of this model takes minutes on a CPU.
    model.jit_compile = model.jit_compile and keras.backend.backend() != "torch"
    model.fit(tokens[:, :-1], tokens[:, 1:], epochs=1, verbose=0)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2
    print("ok", keras.backend.backend(), type(model.optimizer).__module__, "torch" in sys.modules)
"""


@pytest.mark.other_backends
@pytest.mark.parametrize("saved_on, loaded_on", [("torch", "jax"), ("jax", "tensorflow"), ("tensorflow", "torch")])
def test_compiled_model_saved_on_one_backend_loads_with_its_optimizer_state_and_trains_on_another(
        saved_on, loaded_on, tmp_path):
    """A compiled model's `.keras` file names its optimizer `keras.optimizers.Adam` on every backend
    (PyTorch's Adam subclass included), so `keras.saving.load_model` restores the optimizer and its
    variables on another backend, without the saving backend installed, and `fit` goes on."""
    saved = run_python(_COMPILE_TRAIN_AND_SAVE, tmp_path, backend=saved_on)
    assert saved.split()[-3:] == ["keras.optimizers", "Adam", "None"], saved
    loading_folder = tmp_path / "load"
    loading_folder.mkdir()
    if saved_on == "torch":
        _hide_packages(loading_folder, ("torch",))
    output = run_python(_LOAD_COMPILED_AND_TRAIN, loading_folder, backend=loaded_on)
    assert output.split()[:2] == ["ok", loaded_on], output
