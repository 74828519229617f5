"""examples/: the IMDB and ListOps classifiers end to end on tiny settings, their SavedModels
serving raw strings in a fresh process, predict.py, and where long_text_classifier.py finds data.

The corpora are fixtures written here in the layouts the script reads (train.jsonl.gz /
test.jsonl.gz, and an extracted aclImdb/ folder); nothing is downloaded.
"""

import gzip
import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_yoso

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
sys.path.insert(0, EXAMPLES)

import listops  # noqa: E402
import long_text_classifier  # noqa: E402
import sequence_classification  # noqa: E402

TINY_MODEL = ["--num-layers", "1", "--hidden-dim", "16", "--ffn-dim", "16", "--num-heads", "2", "--num-hashes", "4",
              "--hash-code-len", "4", "--batch-size", "8", "--epochs", "1"]
ATTENTIONS = ["yoso", "yoso_e", "softmax", pytest.param("linear_relative", marks=pytest.mark.skipif(
    not hasattr(keras_yoso.layers, "LinearRelativeAttention"), reason="keras_yoso.LinearRelativeAttention missing"))]
SAMPLE_REVIEWS = ["A wonderful film, I loved every minute of it.",
                  "Dull and far too long.<br /><br />The plot is awful. " * 12,  # longer than --max-length
                  "Ça, c'est très bien ! \u2603",
                  ""]
SAMPLE_EXPRESSIONS = ["[MAX 2 9 [MIN 4 7 ] 0 ]", "[SM 5 5 ]", "[MED 1 [MAX 3 8 ] 2 6 ]", "7"]
_GOOD = ["wonderful", "great", "moving", "superb", "fun", "brilliant", "héroïque"]
_BAD = ["awful", "boring", "dull", "waste", "poor", "terrible", "bête"]
_FILLER = ["the", "film", "movie", "plot", "actors", "story", "scene", "and", "it", "was", "<br />"]


def _reviews(num_per_class, seed):
    """[(text, label)]: filler words with words of the label's sentiment, 3 to 120 words long."""
    rng = np.random.default_rng(seed)
    rows = []
    for label, words in ((0, _BAD), (1, _GOOD)):
        for _ in range(num_per_class):
            length = int(rng.integers(3, 120))
            tokens = [rng.choice(words) if rng.random() < 0.3 else rng.choice(_FILLER) for _ in range(length)]
            rows.append((" ".join(tokens).capitalize() + ".", label))
    return rows


CORPUS = {"train": _reviews(20, seed=1), "test": _reviews(8, seed=2)}


@pytest.fixture(scope="module")
def imdb_jsonl_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("imdb_jsonl")
    for split, rows in CORPUS.items():
        with gzip.open(folder / f"{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            for i, (text, label) in enumerate(rows):
                f.write(json.dumps({"text": text, "label": label, "id": f"{split}/{i}"}) + "\n")
    return str(folder)


@pytest.fixture(scope="module")
def aclimdb_parent_dir(tmp_path_factory):
    """A folder holding aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt with the same reviews."""
    folder = tmp_path_factory.mktemp("imdb_folder")
    for split, rows in CORPUS.items():
        for i, (text, label) in enumerate(rows):
            class_dir = folder / "aclImdb" / split / long_text_classifier.CLASS_NAMES[label]
            class_dir.mkdir(parents=True, exist_ok=True)
            (class_dir / f"{i}_{8 if label else 2}.txt").write_text(text, encoding="utf-8")
    return str(folder)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, imdb_jsonl_dir, aclimdb_parent_dir):
    """run(name) -> RunResult of one tiny training run, each trained once per module."""
    runs = {}

    def run(name):
        if name not in runs:
            output_dir = str(tmp_path_factory.mktemp(name))
            kind, attention = name.rsplit("-", 1)
            common = ["--attention", attention, "--output-dir", output_dir, "--seed", "1"] + TINY_MODEL
            if kind == "imdb_bytes":
                runs[name] = long_text_classifier.main(
                    ["--data-dir", imdb_jsonl_dir, "--max-length", "128"] + common)
            elif kind == "imdb_wordpiece":
                runs[name] = long_text_classifier.main(
                    ["--data-dir", aclimdb_parent_dir, "--tokenizer", "wordpiece", "--vocab-size", "150",
                     "--max-length", "64"] + common)
            else:
                runs[name] = listops.main(["--train-examples", "24", "--test-examples", "8", "--min-length", "5",
                                           "--max-length", "60", "--max-depth", "4"] + common)
        return runs[name]

    return run


def _probabilities(result, texts):
    return result.serving_model(tf.constant(texts, tf.string), training=False).numpy()


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_imdb_run_writes_metrics_history_and_a_raw_string_serving_model(trained, attention):
    result = trained(f"imdb_bytes-{attention}")
    with open(os.path.join(result.output_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    assert 0.0 <= metrics["test_accuracy"] <= 1.0 and np.isfinite(metrics["test_loss"])
    assert metrics["num_test_examples"] == 16 and metrics["num_train_examples"] + metrics[
        "num_validation_examples"] == 40
    assert metrics["train_examples_per_second"] > 0 and metrics["peak_rss_mib"] > 0
    assert metrics["args"]["attention"] == attention and metrics["args"]["max_length"] == 128
    assert len(metrics["history"]["val_accuracy"]) == 1
    steps = metrics["step_history"]["step"]
    assert steps and steps == sorted(steps) and steps[-1] <= metrics["batches_per_epoch"]
    assert all(np.isfinite(metrics["step_history"]["loss"]))
    with open(os.path.join(result.output_dir, "history.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.exists(os.path.join(result.output_dir, "saved_model", "saved_model.pb"))

    probabilities = _probabilities(result, SAMPLE_REVIEWS)
    assert probabilities.shape == (len(SAMPLE_REVIEWS), 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    # Padding to the longest string of the batch changes nothing: each review alone scores the same.
    alone = np.concatenate([_probabilities(result, [text]) for text in SAMPLE_REVIEWS])
    np.testing.assert_allclose(alone, probabilities, atol=1e-6)


@pytest.mark.parametrize("attention, layer_class, options", [
    ("yoso", keras_yoso.YosoAttention, {"use_expectation": False, "num_hashes": 4, "hash_code_len": 4}),
    ("yoso_e", keras_yoso.YosoAttention, {"use_expectation": True, "hash_code_len": 4}),
    ("softmax", keras.layers.MultiHeadAttention, {}),
])
def test_attention_option_selects_the_encoder_attention(trained, attention, layer_class, options):
    classifier = trained(f"imdb_bytes-{attention}").classifier
    layer = classifier.get_layer("encoder_0").attention_layer
    assert type(layer) is layer_class
    assert {name: getattr(layer, name) for name in options} == options


def test_conv_window_builds_yoso_c():
    args = long_text_classifier.build_parser().parse_args(TINY_MODEL + ["--conv-window", "3", "--max-length", "32"])
    classifier = sequence_classification.build_classifier(257, 2, args)
    layer = classifier.get_layer("encoder_0").attention_layer
    assert (layer.conv_window, layer.num_hashes, layer.hash_code_len) == (3, 4, 4)
    probabilities = classifier(np.array([[5, 6, 7, 0, 0], [9, 0, 0, 0, 0]], np.int32)).numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_wordpiece_run_learns_its_vocabulary_from_the_training_split_and_caches_it(trained, monkeypatch):
    result = trained("imdb_wordpiece-softmax")
    vocab_files = [name for name in os.listdir(result.output_dir) if name.startswith("wordpiece_vocab_150_")]
    assert len(vocab_files) == 1
    with open(os.path.join(result.output_dir, vocab_files[0]), encoding="utf-8") as f:
        vocabulary = f.read().splitlines()
    assert vocabulary[:2] == ["[PAD]", "[UNK]"] and "awful" in vocabulary and len(vocabulary) <= 150
    ids = sequence_classification.WordpieceTokenizer(vocabulary, 64)(tf.constant(["Awful PLOT", "a"])).numpy()
    assert ids.shape == (2, 2) and ids[0, 0] == vocabulary.index("awful") and ids[1, 1] == 0  # padding id 0

    def learn_again(*args, **kwargs):
        raise AssertionError("the cached vocabulary was not reused")

    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset
    monkeypatch.setattr(bert_vocab_from_dataset, "bert_vocab_from_dataset", learn_again)
    train, _ = long_text_classifier.load_imdb(result.metrics["args"]["data_dir"])
    train = long_text_classifier.take(train, None, 1)
    train, _ = sequence_classification.hold_out(train, 0.1, 1)
    assert long_text_classifier.wordpiece_vocabulary(train.texts, 150, result.output_dir) == vocabulary


def test_listops_run_trains_ten_classes_and_serves_raw_expressions(trained):
    result = trained("listops-yoso")
    assert result.metrics["task"] == "listops" and result.metrics["class_names"] == [str(d) for d in range(10)]
    assert result.metrics["num_test_examples"] == 8
    probabilities = _probabilities(result, SAMPLE_EXPRESSIONS)
    assert probabilities.shape == (len(SAMPLE_EXPRESSIONS), 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


_LOAD_EXPORTS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
import keras_yoso  # noqa: F401
requests = json.loads(sys.stdin.read())
probabilities = {}
for path, texts in requests.items():
    model = tf.saved_model.load(path)  # kept referenced while serving: serve() uses its variables
    probabilities[path] = model.serve(tf.constant(texts)).numpy().tolist()
examples = [m for m in ("sequence_classification", "long_text_classifier", "listops", "listops_data")
            if m in sys.modules]
print(json.dumps({"probabilities": probabilities, "example_modules": examples}))
"""


def test_exports_in_a_fresh_process_return_the_in_memory_probabilities(trained, tmp_path):
    requests, expected = {}, {}
    for name, texts in (("imdb_bytes-yoso", SAMPLE_REVIEWS), ("imdb_wordpiece-softmax", SAMPLE_REVIEWS),
                        ("listops-yoso", SAMPLE_EXPRESSIONS)):
        result = trained(name)
        path = os.path.join(result.output_dir, "saved_model")
        requests[path], expected[path] = texts, _probabilities(result, texts)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    process = subprocess.run([sys.executable, "-c", _LOAD_EXPORTS], input=json.dumps(requests), cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    answer = json.loads(process.stdout.strip().splitlines()[-1])
    assert answer["example_modules"] == []
    for path, probabilities in expected.items():
        np.testing.assert_allclose(np.array(answer["probabilities"][path]), probabilities, atol=1e-5,
                                   err_msg=path)


def test_predict_prints_label_and_probability_per_text(trained, tmp_path):
    result = trained("imdb_bytes-yoso")
    texts = SAMPLE_REVIEWS[:2]
    process = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "predict.py"), os.path.join(result.output_dir, "saved_model")]
        + texts, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    lines = process.stdout.strip().splitlines()
    assert len(lines) == 2
    expected = _probabilities(result, texts)
    for line, text, row in zip(lines, texts, expected):
        label, probability, shown = line.split("\t")
        assert label == long_text_classifier.CLASS_NAMES[row.argmax()]
        assert float(probability) == pytest.approx(row.max(), abs=1e-4)
        assert text.startswith(shown.removesuffix("..."))


def test_offline_without_data_exits_nonzero_saying_to_pass_data_dir(tmp_path):
    stub = tmp_path / "stub" / "tensorflow_datasets"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('no tensorflow_datasets in this test')\n")
    env = {**os.environ, "PYTHONPATH": str(stub.parent)}
    process = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "long_text_classifier.py"), "--output-dir", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert process.returncode != 0
    assert "Pass --data-dir /path/with/train.jsonl.gz" in process.stderr
    assert not (tmp_path / "out").exists()


def test_failed_tensorflow_datasets_download_exits_saying_to_pass_data_dir(monkeypatch):
    class OfflineTfds:
        @staticmethod
        def load(*args, **kwargs):
            raise ConnectionError("network is unreachable")

    monkeypatch.setitem(sys.modules, "tensorflow_datasets", OfflineTfds)
    with pytest.raises(SystemExit) as exit_info:
        long_text_classifier.main(TINY_MODEL)
    message = str(exit_info.value.code)
    assert "could not load imdb_reviews (ConnectionError: network is unreachable)" in message
    assert "Pass --data-dir /path/with/train.jsonl.gz" in message


def test_data_dir_without_a_known_layout_exits_saying_what_it_needs(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        long_text_classifier.load_imdb(str(tmp_path))
    assert "holds neither train.jsonl.gz nor an aclImdb/ folder" in str(exit_info.value.code)
    assert "Pass --data-dir /path/with/train.jsonl.gz" in str(exit_info.value.code)


def test_aclimdb_folder_and_jsonl_files_give_the_same_reviews(imdb_jsonl_dir, aclimdb_parent_dir):
    from_jsonl = long_text_classifier.load_imdb(imdb_jsonl_dir)
    for folder in (aclimdb_parent_dir, os.path.join(aclimdb_parent_dir, "aclImdb")):
        from_folder = long_text_classifier.load_imdb(folder)
        for split_jsonl, split_folder in zip(from_jsonl, from_folder):
            assert sorted(zip(split_folder.texts, split_folder.labels.tolist())) == sorted(
                zip(split_jsonl.texts, split_jsonl.labels.tolist()))


def test_bucketed_batches_group_similar_lengths_and_cover_each_example_once():
    lengths = [3, 5, 130, 140, 150, 300, 700, 1000, 7, 260, 129, 127]
    split = sequence_classification.Split(["x" * n for n in lengths], list(range(len(lengths))))
    tokenizer = sequence_classification.ByteTokenizer(max_length=512)
    dataset, num_batches = sequence_classification.batched_dataset(split, tokenizer, batch_size=2, shuffle_seed=0)
    for _ in range(2):  # two passes, reshuffled
        batches = list(dataset.as_numpy_iterator())
        assert len(batches) == num_batches == 6  # buckets [0, 128), [128, 256), [256, 512]: 4 examples each
        seen = []
        for token_ids, labels in batches:
            true_lengths = (token_ids != 0).sum(axis=1)
            assert token_ids.shape[1] == true_lengths.max()  # padded to the longest of the batch only
            assert len({int(np.searchsorted([128, 256], n, side="right")) for n in true_lengths}) == 1
            assert all(true_lengths == [min(lengths[i], 512) for i in labels])  # truncated at max_length
            seen += labels.tolist()
        assert sorted(seen) == list(range(len(lengths)))


@pytest.mark.parametrize("argv, match", [
    (["--attention", "softmax", "--conv-window", "3"], "--conv-window .*needs --attention yoso"),
    (["--hidden-dim", "10", "--num-heads", "3"], "--hidden-dim 10 must be a multiple of --num-heads 3"),
    (["--max-length", "0"], "--max-length must be >= 1"),
    (["--dropout", "1.5"], r"--dropout must be in \[0, 1\)"),
])
def test_invalid_options_are_rejected_naming_the_option(argv, match, capsys):
    with pytest.raises(SystemExit) as exit_info:
        long_text_classifier.main(argv)
    assert exit_info.value.code == 2
    assert re.search(match, capsys.readouterr().err)
