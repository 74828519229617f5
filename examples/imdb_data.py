"""IMDB movie reviews for long_text_classifier.py --data-dir, in either layout its docstring describes
(train.jsonl.gz and test.jsonl.gz, or an extracted aclImdb/ folder; nothing is downloaded), and the BERT
wordpiece vocabulary learned from the training split, cached next to the data.
"""

import glob
import gzip
import hashlib
import json
import os
import sys

from sequence_classification import Split

IMDB_CLASS_NAMES = ("neg", "pos")
WORDPIECE_RESERVED_TOKENS = ["[PAD]", "[UNK]"]  # [PAD] gets id 0, the padding id
IMDB_SOURCE = ("the Large Movie Review Dataset, https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz "
               "(extract it and pass the aclImdb/ folder)")


def _no_data(reason):
    sys.exit(f"error: no IMDB data: {reason}.\n"
             f"IMDB is {IMDB_SOURCE}. Pass --data-dir with either an extracted aclImdb/ folder (or its parent), "
             "holding train/pos, train/neg, test/pos, test/neg of *.txt reviews, or a folder holding "
             "train.jsonl.gz and test.jsonl.gz (one JSON object with \"text\" and \"label\" per line, 0 = neg, "
             "1 = pos). Without --data-dir the script trains on its built-in long-range task.")


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
    for label, name in enumerate(IMDB_CLASS_NAMES):
        for path in sorted(glob.glob(os.path.join(split_dir, name, "*.txt"))):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
            labels.append(label)
    if not texts:
        raise FileNotFoundError(f"no reviews in {split_dir}/neg/*.txt or {split_dir}/pos/*.txt")
    return Split(texts, labels)


def load_imdb(data_dir):
    """(train, test) Splits from --data-dir; exits saying what to pass when it holds neither layout."""
    if not os.path.isdir(data_dir):
        _no_data(f"--data-dir {data_dir} is not a folder")
    if os.path.exists(os.path.join(data_dir, "train.jsonl.gz")):
        test_path = os.path.join(data_dir, "test.jsonl.gz")
        if not os.path.exists(test_path):
            _no_data(f"--data-dir {data_dir} has train.jsonl.gz but no test.jsonl.gz")
        return read_jsonl(os.path.join(data_dir, "train.jsonl.gz")), read_jsonl(test_path)
    for root in (data_dir, os.path.join(data_dir, "aclImdb")):
        if os.path.isdir(os.path.join(root, "train", "pos")):
            return read_aclimdb(os.path.join(root, "train")), read_aclimdb(os.path.join(root, "test"))
    _no_data(f"--data-dir {data_dir} holds neither train.jsonl.gz nor an aclImdb/ folder with train/pos")


def take(split, max_examples, seed):
    """A seeded random subset of at most `max_examples` (aclImdb folders are sorted by class)."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(split))
    return split.subset(order[:max_examples] if max_examples is not None else order)


def vocabulary_cache_dir(data_dir):
    """Next to the data when writable, else runs/cache."""
    cache = os.path.join(data_dir, ".keras_yoso_cache")
    try:
        os.makedirs(cache, exist_ok=True)
        probe = os.path.join(cache, ".write_test")
        with open(probe, "w"):
            pass
        os.remove(probe)
        return cache
    except OSError:
        return os.path.join("runs", "cache")


def wordpiece_vocabulary(texts, vocab_size, cache_dir):
    """A BERT wordpiece vocabulary learned from `texts`, cached in `cache_dir` under a digest of the texts."""
    digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:12]
    path = os.path.join(cache_dir, f"wordpiece_vocab_{vocab_size}_{digest}.txt")
    if os.path.exists(path):
        print(f"wordpiece vocabulary: {path} (cached)", flush=True)
        with open(path, encoding="utf-8", newline="\n") as f:
            return f.read().split("\n")[:-1]  # one token per line; no other character ends a line
    import tensorflow as tf
    from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset

    print(f"learning a {vocab_size}-token wordpiece vocabulary from {len(texts)} reviews (cached in {path})",
          flush=True)
    vocabulary = bert_vocab_from_dataset.bert_vocab_from_dataset(
        tf.data.Dataset.from_tensor_slices(tf.constant(texts, tf.string)).batch(1000).prefetch(2),
        vocab_size=vocab_size, reserved_tokens=WORDPIECE_RESERVED_TOKENS,
        bert_tokenizer_params={"lower_case": True})
    os.makedirs(cache_dir, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(f"{token}\n" for token in vocabulary))
    return vocabulary
