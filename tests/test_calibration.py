"""keras_yoso.calibrate (issue 42, item 2) and YosoAttention's `output_scale`: the calibrated layers err no more
than the converted ones on the calibration inputs, the calibration lives in the config (a `.keras` file keeps
it), the default changes nothing, and bad arguments raise. Tiny models. Measured on 2 cores shared with other
jobs: 24-25 s on TensorFlow and PyTorch, 79 s on JAX (each eager op compiles), the benchmark's dry run 18-36 s
of it."""

import glob
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_yoso
from conftest import runs_on

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQUENCE, FEATURES = 12, 8


def _original():
    """A Functional model of two softmax attention layers (2 heads of 4) with residuals, random weights; and a
    model that returns the input of each attention layer."""
    keras.utils.set_random_seed(0)
    x = keras.Input((SEQUENCE, FEATURES))
    h, states = x, []
    for i in range(2):
        states.append(h)
        attention = keras.layers.MultiHeadAttention(2, 4, name=f"attention_{i}")
        h = keras.layers.LayerNormalization(name=f"norm_{i}")(h + attention(h, h))
        h = keras.layers.Dense(FEATURES, activation="gelu", name=f"dense_{i}")(h)
    model = keras.Model(x, h)
    for layer in model.layers:  # larger values than glorot's, so that the softmax outputs are not tiny
        if isinstance(layer, keras.layers.MultiHeadAttention):
            layer.value_dense.kernel.assign(3.0 * keras.ops.convert_to_numpy(layer.value_dense.kernel))
    return model, keras.Model(x, states)


def _inputs(count, seed):
    return np.random.default_rng(seed).normal(size=(count, SEQUENCE, FEATURES)).astype("float32")


def _layer_errors(original, states, model, inputs):
    """Per attention layer, |y - y_softmax| / |y_softmax| given the softmax model's input to that layer."""
    errors = []
    for i, state in enumerate(states(inputs)):
        name = f"attention_{i}"
        truth = keras.ops.convert_to_numpy(original.get_layer(name)(state, state))
        out = keras.ops.convert_to_numpy(model.get_layer(name)(state, state))
        errors.append(float(np.linalg.norm(out - truth) / np.linalg.norm(truth)))
    return np.asarray(errors)


@pytest.fixture(scope="module")
def calibrated():
    original, states = _original()
    converted = keras_yoso.replace_attention(original, "yoso", num_hashes=4, hash_code_len=8, seed=1)
    inputs = _inputs(6, seed=1)
    model = keras_yoso.calibrate(converted, original, inputs, hash_code_lens=[2, 3, 4], batch_size=4, verbose=False)
    return original, states, converted, model, inputs


def test_calibrated_layers_err_no_more_than_the_converted_ones_on_the_calibration_inputs(calibrated):
    original, states, converted, model, inputs = calibrated
    before = _layer_errors(original, states, converted, inputs)
    after = _layer_errors(original, states, model, inputs)
    assert np.all(after <= before + 1e-5), (before, after)
    assert np.all(after < 0.9 * before), (before, after)  # the fit changed each layer, and for the better
    for i in range(2):
        layer = model.get_layer(f"attention_{i}")
        assert layer.hash_code_len in (2, 3, 4, 8) and len(layer.output_scale) == 2
        assert converted.get_layer(f"attention_{i}").output_scale is None  # the converted model is left unchanged


def test_calibration_is_kept_in_the_config_and_through_a_keras_file(calibrated, tmp_path):
    _, _, _, model, inputs = calibrated
    path = str(tmp_path / "calibrated.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    for i in range(2):
        config = loaded.get_layer(f"attention_{i}").get_config()
        assert config["output_scale"] == model.get_layer(f"attention_{i}").get_config()["output_scale"]
        assert config["hash_code_len"] == model.get_layer(f"attention_{i}").hash_code_len
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(inputs)), keras.ops.convert_to_numpy(model(inputs)),
                               rtol=0, atol=1e-6)


def test_the_default_output_scale_changes_nothing_and_configs_saved_before_load():
    x = _inputs(2, seed=2)
    plain = keras_yoso.YosoAttention(2, 4, seed=3)
    assert plain.output_scale is None and plain.get_config()["output_scale"] is None
    expected = keras.ops.convert_to_numpy(plain(x, x))
    config = plain.get_config()
    del config["output_scale"]  # a layer saved before the argument existed
    for layer in (keras_yoso.YosoAttention.from_config(config),
                  keras_yoso.YosoAttention.from_config({**config, "output_scale": [1.0, 1.0]})):
        layer(x, x)
        layer.set_weights(plain.get_weights())
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(x, x)), expected)


def test_output_scale_multiplies_each_heads_output_before_the_projection():
    x = _inputs(2, seed=3)
    layers = [keras_yoso.YosoAttention(2, 4, use_bias=False, seed=5, output_scale=scale)
              for scale in ([1.0, 0.0], [0.0, 1.0], [3.0, -0.5])]
    for layer in layers:
        layer(x, x)
        layer.set_weights(layers[0].get_weights())
    first, second, mixed = (keras.ops.convert_to_numpy(layer(x, x)) for layer in layers)
    np.testing.assert_allclose(mixed, 3.0 * first - 0.5 * second, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale, match", [
    ([1.0, float("nan")], "finite floats"), ("1", "finite floats"), ([], "finite floats"), ([1.0, True], "finite"),
])
def test_bad_output_scale_raises_naming_the_argument(scale, match):
    with pytest.raises(ValueError, match=f"output_scale.*{match}"):
        keras_yoso.YosoAttention(2, 4, output_scale=scale)


def test_an_output_scale_of_the_wrong_length_raises_when_the_layer_is_built():
    x = _inputs(1, seed=4)
    with pytest.raises(ValueError, match=r"output_scale.*num_heads = 2 factors, one per head. Received 3"):
        keras_yoso.YosoAttention(2, 4, output_scale=[1.0, 2.0, 3.0])(x, x)


@pytest.mark.parametrize("function", ["calibrate", "transfer_attention"])
def test_bad_arguments_of_calibrate_and_transfer_attention_raise_naming_them(function):
    """What both functions take (tests/test_transfer.py checks transfer_attention's own arguments)."""
    original, _ = _original()
    converted = keras_yoso.replace_attention(original, "yoso", num_hashes=4, seed=1)
    inputs = _inputs(4, seed=1)
    call = lambda **kw: getattr(keras_yoso, function)(**{"model": converted, "original": original,  # noqa: E731
                                                          "inputs": inputs, "verbose": False, **kw})
    with pytest.raises(ValueError, match="converted keras.Model as `model`"):
        call(model="not a model")
    with pytest.raises(ValueError, match="softmax keras.Model .* as `original`"):
        call(original=None)
    with pytest.raises(ValueError, match="batch_size"):
        call(batch_size=0)
    with pytest.raises(ValueError, match=f"{function} expects `inputs` whose arrays all have the same number"):
        call(inputs=[inputs, inputs[:2]])
    with pytest.raises(ValueError, match=f"{function} fits YosoAttention layers.*MultiHeadAttention"):
        call(model=original)
    with pytest.raises(ValueError, match="fits YosoAttention layers.*LinearRelativeAttention"):
        call(model=keras_yoso.replace_attention(original, "linear_relative"))
    other, _ = _original()
    smaller = keras.Model(other.input, other.get_layer("norm_0").output)
    with pytest.raises(ValueError, match="differ in number: 2 in model .* 1 in original"):
        call(original=smaller)


def test_bad_hash_code_lens_raise_naming_them(calibrated):
    original, _, converted, _, inputs = calibrated
    for lens, match in (([], "hash_code_lens.*empty"), ([0, 4], r"hash_code_len.*\[1, 20\]"),
                        ("4", "hash_code_lens")):
        with pytest.raises(ValueError, match=match):
            keras_yoso.calibrate(converted, original, inputs, hash_code_lens=lens, verbose=False)


def test_calibrates_a_keras_hub_bert_with_extended_positions():
    """replace_attention(max_length=32) of a 16-position BERT, calibrated on 32-token inputs (the reference: the
    softmax model with its positions extended as replace_attention extends them); the calibration lives in the
    encoders' attention_kwargs."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(vocabulary_size=64, num_layers=2, num_heads=2, hidden_dim=16,
                                             intermediate_dim=32, max_sequence_length=16)
    converted = keras_yoso.replace_attention(backbone, "yoso", max_length=32, num_hashes=4, seed=2)
    ids = np.random.default_rng(0).integers(1, 64, size=(3, 32)).astype("int32")
    padding = np.ones_like(ids)
    padding[0, 20:] = 0  # padded positions are left out of the fit
    inputs = {"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": padding}
    model = keras_yoso.calibrate(converted, backbone, inputs, hash_code_lens=[2, 4], verbose=False)
    for i in range(2):
        kwargs = model.get_layer(f"transformer_layer_{i}").attention_kwargs
        assert kwargs["hash_code_len"] in (2, 4, 6) and len(kwargs["output_scale"]) == 2
    assert model(inputs)["sequence_output"].shape == (3, 32, 16)


@runs_on("torch")  # measured 2026-11-30: 24 s on PyTorch, 59 s on TensorFlow, 53 s on JAX
def test_benchmark_dry_run_calibrates_and_transfers_and_docs_quote_the_records(tmp_path):
    """benchmarks/calibration.py on a tiny random BERT, with transfer_attention; docs/results.md holds what
    --render gives from each committed record, and its and the README's per-run tables are what --runs gives."""
    proc = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), "--dry-run", "--out-dir",
                           str(tmp_path), "--transfer-steps", "2", "--no-ceiling"], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "calibration.json").read_text())
    for length in (16, 32):
        rows = {(r["model"], r["text"]): r for r in record["rows"] if r["length"] == length}
        assert np.all(np.asarray(rows["calibrated", "calibration"]["layer_error"])
                      <= np.asarray(rows["converted", "calibration"]["layer_error"]) + 1e-5)
        assert np.all(np.isfinite(rows["transferred", "held-out"]["layer_error"]))
    assert ("YOSO-E transferred", "held-out") in {(r["model"], r["text"]) for r in record["rows"]}
    with open(os.path.join(REPO, "docs", "results.md"), encoding="utf-8") as f:
        results = f.read()
    names = sorted(glob.glob(os.path.join(REPO, "docs", "data", "calibration_*.json")))
    assert len(names) >= 2
    for name in names:
        rendered = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), "--render", name],
                                  cwd=REPO, capture_output=True, text=True, timeout=60)
        assert rendered.returncode == 0, rendered.stderr[-3000:]
        assert rendered.stdout.strip() in results, name
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    blocks = re.findall(r"<!-- calibration-runs (\d+): (.+?) -->\n(.*?)\n<!-- /calibration-runs -->",
                        results + readme, re.S)
    assert len(blocks) >= 2, "docs/results.md and README.md each quote a per-run table"
    for length, files, table in blocks:
        rendered = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), "--render",
                                   *files.split(), "--runs", length], cwd=REPO, capture_output=True, text=True,
                                  timeout=60)
        assert rendered.returncode == 0, rendered.stderr[-3000:]
        assert table.strip() == rendered.stdout.strip(), files


@runs_on("torch")
def test_benchmark_dry_run_with_a_local_window_records_locality_and_trains_the_window_scale(tmp_path):
    """--local-window and --locality on a tiny random BERT: no calibrated rows with --no-calibrate, each layer's
    share of softmax attention within each window (a fraction, larger for the larger window), and each transferred
    layer's window scale in the record and the rendered tables."""
    proc = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), "--dry-run", "--out-dir",
                           str(tmp_path), "--transfer-steps", "2", "--no-ceiling", "--no-calibrate",
                           "--local-window", "2", "--locality", "2", "4", "--record", str(tmp_path / "record.json")],
                          cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "calibration.json").read_text())
    assert record["settings"]["local_window"] == 2 and record["settings"]["calibrated"] is False
    assert "calibrated" not in {r["model"] for r in record["rows"]}
    for length in ("16", "32"):
        narrow, wide = (np.asarray(record["locality"][length][w]) for w in ("2", "4"))
        assert narrow.shape == (2, 2) and np.all((0 < narrow) & (narrow < wide) & (wide <= 1 + 1e-6))
    scales = [r["local_window_scale"] for r in record["layers"] if r["model"] == "transferred"]
    assert len(scales) == 4 and all(len(s) == 2 and all(np.isfinite(s)) for s in scales)
    rendered = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), "--render",
                               str(tmp_path / "record.json")], cwd=REPO, capture_output=True, text=True,
                              timeout=60)
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    assert "an exact local window of 2" in rendered.stdout and "not calibrated" in rendered.stdout
    assert r"\|i - j\| < 4" in rendered.stdout and ", window " in rendered.stdout


def test_the_benchmarks_table_options_without_render_or_together_raise_naming_them():
    record = os.path.join("docs", "data", "calibration_2026-11-29.json")
    for argv, match in ((["--pretrained", "unused", "--runs", "2048"], "--summary and --runs format records"),
                        (["--render", record, "--summary", "--runs", "2048"], "--summary and --runs 2048 are two")):
        proc = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), *argv], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and match in proc.stderr, proc.stderr[-3000:]


def test_the_readme_conversion_summary_is_what_the_record_gives():
    rendered = subprocess.run([sys.executable, os.path.join("benchmarks", "calibration.py"), "--render",
                               os.path.join("docs", "data", "calibration_2026-11-29.json"), "--summary"], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr[-3000:]
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    block = readme.split("<!-- conversion-summary: docs/data/calibration_2026-11-29.json -->\n")[1]
    assert block.split("<!-- /conversion-summary -->")[0].strip() == rendered.stdout.strip()
