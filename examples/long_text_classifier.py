"""Long-text classification: IMDB movie reviews as up to 4096 UTF-8 bytes (the LRA "Text" task).

Trains the LRA classifier (token + position embedding -> 2 x TransformerEncoderBlock ->
masked mean pooling -> classifier) with YOSO, YOSO-E, Scaleformer or softmax attention,
reports test accuracy, and exports a SavedModel that classifies raw review strings:

    python examples/long_text_classifier.py --data-dir ../shared/data/imdb --tokenizer wordpiece \\
        --max-train-examples 4000 --max-test-examples 1000 --epochs 2 --batch-size 16 --learning-rate 1e-3
    python examples/predict.py runs/imdb-wordpiece-yoso/saved_model "A wonderful film." "Dull."

(about 80% test accuracy in 4 minutes on 2 CPU cores). The LRA "Text" setting is the
default --tokenizer bytes; it learns far more slowly (docs/results.md).

Data, the first that applies:
  --data-dir DIR with train.jsonl.gz and test.jsonl.gz (one JSON object per line with
      "text" and "label", 0 = neg, 1 = pos),
  --data-dir DIR that is, or contains, an extracted aclImdb/ folder (train/pos/*.txt, ...),
  tensorflow_datasets' imdb_reviews (downloaded when online; `pip install tensorflow-datasets`).

Tokenization runs inside the TensorFlow graph (tensorflow-text), in the tf.data pipeline and
in the exported model: --tokenizer bytes (LRA: byte ids, --max-length 4096) or wordpiece (a
BERT wordpiece vocabulary learned from the training split, cached in --output-dir).
"""

import argparse
import glob
import gzip
import hashlib
import json
import os
import sys

import numpy as np
import tensorflow as tf

import sequence_classification
from sequence_classification import Split

CLASS_NAMES = ("neg", "pos")
WORDPIECE_RESERVED_TOKENS = ["[PAD]", "[UNK]"]  # [PAD] gets id 0, the padding id


def _no_data(reason):
    sys.exit(f"error: no IMDB data: {reason}.\n"
             "Pass --data-dir /path/with/train.jsonl.gz (a folder holding train.jsonl.gz and test.jsonl.gz, "
             "one JSON object with \"text\" and \"label\" per line), or --data-dir /path/to/aclImdb "
             "(the extracted Large Movie Review Dataset), e.g. --data-dir ../shared/data/imdb")


def read_jsonl(path):
    texts, labels = [], []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            texts.append(row["text"])
            labels.append(int(row["label"]))
    return Split(texts, labels)


def read_aclimdb(split_dir):
    """An aclImdb split folder: `<split_dir>/neg/*.txt` (label 0) and `<split_dir>/pos/*.txt` (label 1)."""
    texts, labels = [], []
    for label, name in enumerate(CLASS_NAMES):
        for path in sorted(glob.glob(os.path.join(split_dir, name, "*.txt"))):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
            labels.append(label)
    if not texts:
        raise FileNotFoundError(f"no reviews in {split_dir}/neg/*.txt or {split_dir}/pos/*.txt")
    return Split(texts, labels)


def load_imdb(data_dir):
    """(train, test) Splits from --data-dir or tensorflow_datasets; exits with what to pass when there is none."""
    if data_dir is not None:
        if os.path.exists(os.path.join(data_dir, "train.jsonl.gz")):
            test_path = os.path.join(data_dir, "test.jsonl.gz")
            if not os.path.exists(test_path):
                _no_data(f"--data-dir {data_dir} has train.jsonl.gz but no test.jsonl.gz")
            return read_jsonl(os.path.join(data_dir, "train.jsonl.gz")), read_jsonl(test_path)
        for root in (data_dir, os.path.join(data_dir, "aclImdb")):
            if os.path.isdir(os.path.join(root, "train", "pos")):
                return read_aclimdb(os.path.join(root, "train")), read_aclimdb(os.path.join(root, "test"))
        _no_data(f"--data-dir {data_dir} holds neither train.jsonl.gz nor an aclImdb/ folder with train/pos")
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        _no_data("no --data-dir given and tensorflow_datasets is not installed")
    try:
        train, test = tfds.load("imdb_reviews", split=["train", "test"], as_supervised=True, batch_size=-1)
    except Exception as error:  # offline, or a broken download: tfds raises many kinds
        _no_data(f"no --data-dir given and tensorflow_datasets could not load imdb_reviews "
                 f"({type(error).__name__}: {error})")
    return tuple(Split([t.decode("utf-8") for t in texts.numpy()], labels.numpy())
                 for texts, labels in (train, test))


def take(split, max_examples, seed):
    """A seeded random subset of at most `max_examples` (aclImdb folders are sorted by class)."""
    order = np.random.default_rng(seed).permutation(len(split))
    return split.subset(order[:max_examples] if max_examples is not None else order)


def wordpiece_vocabulary(texts, vocab_size, cache_dir):
    """A BERT wordpiece vocabulary learned from `texts`, cached in `cache_dir` under a digest of the texts."""
    digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:12]
    path = os.path.join(cache_dir, f"wordpiece_vocab_{vocab_size}_{digest}.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8", newline="\n") as f:
            return f.read().split("\n")[:-1]  # one token per line; no other character ends a line
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

    print(f"learning a {vocab_size}-token wordpiece vocabulary from {len(texts)} reviews", flush=True)
    vocabulary = bert_vocab_from_dataset.bert_vocab_from_dataset(
        tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string)).batch(1000).prefetch(2),
        vocab_size=vocab_size, reserved_tokens=WORDPIECE_RESERVED_TOKENS,
        bert_tokenizer_params={"lower_case": True})
    os.makedirs(cache_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(f"{token}\n" for token in vocabulary))
    return vocabulary


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    data = parser.add_argument_group("data")
    data.add_argument("--data-dir", default=None,
                      help="folder with train.jsonl.gz/test.jsonl.gz, or an extracted aclImdb/ folder. "
                           "Default: tensorflow_datasets imdb_reviews")
    data.add_argument("--tokenizer", choices=("bytes", "wordpiece"), default="bytes",
                      help="bytes: UTF-8 bytes (LRA Text); wordpiece: learned from the training split. "
                           "Default: %(default)s")
    data.add_argument("--vocab-size", type=int, default=8000,
                      help="wordpiece vocabulary size (--tokenizer wordpiece). Default: %(default)s")
    data.add_argument("--max-train-examples", type=int, default=None,
                      help="use a random subset of the 25,000 training reviews (validation included), "
                           "for quick runs. Default: all")
    data.add_argument("--max-test-examples", type=int, default=None,
                      help="evaluate on a random subset of the 25,000 test reviews. Default: all")
    # The LRA Text setting: appendix Table 4 (length 4096, 2 layers, 64 dims, 128 FFN, 2 heads) and
    # Table 3's YOSO-32 run, m = 32 and tau = log2(4096) = 12 (the authors' LRA configuration,
    # mlpen/YOSO LRA/models/yoso-v1-32/config.json, "text": hash_code_len 12, num_hash 32).
    sequence_classification.add_model_arguments(parser, lra_task="Text", max_length=4096, hash_code_len=12,
                                                num_hashes=32)
    return parser


def main(argv=None):
    parser = build_parser()
    args = sequence_classification.parse_args(parser, argv)
    for name in ("max_train_examples", "max_test_examples"):
        if getattr(args, name) is not None and getattr(args, name) < 2:
            parser.error(f"--{name.replace('_', '-')} must be >= 2, got {getattr(args, name)}")
    if args.vocab_size < len(WORDPIECE_RESERVED_TOKENS) + 1:
        parser.error(f"--vocab-size must be > {len(WORDPIECE_RESERVED_TOKENS)}, got {args.vocab_size}")
    task = f"imdb-{args.tokenizer}"
    args.output_dir = args.output_dir or os.path.join("runs", f"{task}-{args.attention}")

    train, test = load_imdb(args.data_dir)
    train = take(train, args.max_train_examples, args.seed)
    test = take(test, args.max_test_examples, args.seed + 1)
    train, validation = sequence_classification.hold_out(train, args.validation_fraction, args.seed)
    if args.tokenizer == "bytes":
        tokenizer = sequence_classification.ByteTokenizer(args.max_length)
    else:
        vocabulary = wordpiece_vocabulary(train.texts, args.vocab_size, args.output_dir)
        tokenizer = sequence_classification.WordpieceTokenizer(vocabulary, args.max_length)
    return sequence_classification.train_and_export(task, args, tokenizer, CLASS_NAMES, train, validation, test)


if __name__ == "__main__":
    main()
