"""Data of the quality benchmark's tasks, all made or read locally (no downloads).

mqar      multi-query associative recall, generated (`mqar_batch`), Zoology (Arora et al. 2023)
listops   LRA ListOps expressions, examples/listops_data.py
tags      the built-in long-range task of examples/long_range_data.py
imdb      IMDB reviews as UTF-8 bytes (LRA "Text"), /work/shared/data/imdb or $IMDB_DIR
lm        next-byte prediction on IMDB review text (bits per byte)

The classification and LM data sets are a fixed function of the task's arguments (data seed 0),
the same for every training seed, so runs with different seeds and attentions see the same
examples; the training seed only changes the weights, batch order and hashing.
"""

import dataclasses
import functools
import gzip
import json
import os

import numpy as np

IMDB_DIRS = (os.environ.get("IMDB_DIR", ""), "/work/shared/data/imdb",
             os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "imdb"))


# ----------------------------------------------------------------------------- MQAR

def mqar_batch(rng, batch_size, length, pairs, vocab):
    """One batch of multi-query associative recall (Zoology §3, appendix: `multiquery_ar`).

    Keys are drawn from the first half of the vocabulary, [0, vocab // 2), values from the second
    half, [vocab // 2, vocab), both without replacement within a sequence. The sequence starts with
    the `pairs` key-value pairs k_1 v_1 k_2 v_2 ...; then every key appears exactly once more, as a
    query, at a distinct position drawn uniformly from [2 * pairs, length) (so in random order and
    at random gaps). All other positions hold random tokens of the value half (never a key, so no
    position besides the queries repeats a key; Zoology fills them with random tokens too). The
    target at a query position is the value paired with that key: the model, which is causal, must
    recall it from the start of the sequence.

    Args:
        rng: a numpy Generator.
        batch_size, length, pairs, vocab: B, T, P, V; needs 3 P <= T and P <= V / 2.

    Returns:
        tokens [B, T] int32, positions [B, P] int32 (the query positions, ascending), targets
        [B, P] int32 (targets[b, i] = the value of the key at tokens[b, positions[b, i]]).
    """
    if 3 * pairs > length:
        raise ValueError(f"mqar needs 3 * pairs <= length (pairs, then a query per key), got pairs={pairs}, "
                         f"length={length}")
    half = vocab // 2
    if pairs > half:
        raise ValueError(f"mqar needs pairs <= vocab / 2 distinct keys, got pairs={pairs}, vocab={vocab}")
    rows = np.arange(batch_size)[:, None]
    keys = np.argpartition(rng.random((batch_size, half)), pairs - 1, axis=1)[:, :pairs]
    values = half + np.argpartition(rng.random((batch_size, vocab - half)), pairs - 1, axis=1)[:, :pairs]
    tokens = rng.integers(half, vocab, size=(batch_size, length))
    tokens[:, 0:2 * pairs:2] = keys
    tokens[:, 1:2 * pairs:2] = values
    gaps = 2 * pairs + np.argpartition(rng.random((batch_size, length - 2 * pairs)), pairs - 1, axis=1)[:, :pairs]
    tokens[rows, gaps] = keys  # key i is queried at gaps[:, i]
    order = np.argsort(gaps, axis=1)
    positions = np.take_along_axis(gaps, order, axis=1)
    targets = np.take_along_axis(values, order, axis=1)
    return tokens.astype(np.int32), positions.astype(np.int32), targets.astype(np.int32)


def sequence_set(tokens):
    """The rows of tokens [N, T] as a set of bytes (to test a sequence for membership: `mqar_batch_excluding`)."""
    tokens = np.ascontiguousarray(tokens, np.int32)
    return {row.tobytes() for row in tokens}


def mqar_batch_excluding(rng, batch_size, length, pairs, vocab, excluded):
    """`mqar_batch`, with every sequence whose tokens are in `excluded` (a `sequence_set`, e.g. the test
    sequences) replaced by a new draw from `rng`, so that the batch is disjoint from them.

    Without such a sequence the batch and the state of `rng` after it are exactly `mqar_batch`'s. A replaced
    sequence is drawn as a batch of one; after 100 draws that all hit `excluded` it raises RuntimeError (the
    cell is too small to hold the held-out sets apart from the training data).

    Returns:
        tokens [B, T], positions [B, P], targets [B, P], int32, as `mqar_batch`.
    """
    tokens, positions, targets = mqar_batch(rng, batch_size, length, pairs, vocab)
    for row in range(batch_size):
        for _ in range(100):
            if tokens[row].tobytes() not in excluded:
                break
            tokens[row], positions[row], targets[row] = (a[0] for a in mqar_batch(rng, 1, length, pairs, vocab))
        else:
            raise RuntimeError(f"mqar: 100 draws in a row were held-out sequences (length={length}, pairs={pairs}, "
                               f"vocab={vocab}, {len(excluded)} excluded): the cell is too small to keep the "
                               f"training, validation and test sequences apart")
    return tokens, positions, targets


# ----------------------------------------------------------------------------- classification

@dataclasses.dataclass
class ClassificationData:
    """Token ids (lists of int32 arrays, 0 = padding id, never a token) and int32 labels; the validation
    split is empty when none was asked for."""

    train_ids: list
    train_labels: np.ndarray
    test_ids: list
    test_labels: np.ndarray
    vocab_size: int
    num_classes: int
    description: str
    validation_ids: list = dataclasses.field(default_factory=list)
    validation_labels: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros([0], np.int32))


def _imdb_dir():
    for path in IMDB_DIRS:
        if path and os.path.exists(os.path.join(path, "train.jsonl.gz")):
            return path
    raise FileNotFoundError("IMDB data not found: set IMDB_DIR to a folder holding train.jsonl.gz and "
                            f"test.jsonl.gz (looked in {[p for p in IMDB_DIRS if p]})")


@functools.lru_cache(maxsize=2)
def imdb_split(split):
    """(texts, labels) of the IMDB `split` ("train" or "test"), 25,000 reviews each, in file order."""
    with gzip.open(os.path.join(_imdb_dir(), f"{split}.jsonl.gz"), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [row["text"] for row in rows], np.array([row["label"] for row in rows], np.int32)


def _split(texts, labels, sizes, seed):
    """Consecutive parts of one seeded permutation of the examples, `sizes` long each (None: the rest),
    each part in file order: disjoint subsets. A first part of at least all examples is all of them."""
    order = np.random.default_rng(seed).permutation(len(texts))
    parts, begin = [], 0
    for size in sizes:
        end = len(texts) if size is None else begin + size
        keep = np.sort(order[begin:end])
        parts.append(([texts[i] for i in keep], labels[keep]))
        begin = end
    return parts


def _check_disjoint(validation, *others):
    """Raises ValueError when a validation text is also a training or test text (generated data: the
    splits come from separate seed streams, so this never happens unless a generator changes)."""
    seen = set().union(*(set(texts) for texts in others))
    shared = sum(text in seen for text in validation)
    if shared:
        raise ValueError(f"{shared} of {len(validation)} validation examples are also training or test "
                         "examples; the splits must be disjoint")


@functools.lru_cache(maxsize=4)
def load_classification(task, length, train_size, test_size, validation_size=0):
    """The ClassificationData of `task` ("listops", "tags", "imdb") at `length` tokens.

    The validation split (`validation_size` examples, 0: none) never holds a training or test example:
    listops and tags draw it from its own seed stream (train: seed 0 / "quality/train", test: 1 /
    "quality/test", validation: 2 / "quality/validation"); imdb takes it from the training reviews
    that the `train_size` subset left out (so train_size + validation_size <= 25,000).
    """
    from sequence_classification.tokenizers import ByteTokenizer, WhitespaceTokenizer  # examples/

    if validation_size < 0:
        raise ValueError(f"validation_size must be >= 0, got {validation_size}")
    validation = ([], [])
    if task == "listops":
        import listops_data

        generate = dict(min_length=max(1, length // 2), max_length=length)
        train = listops_data.generate_expressions(train_size, "quality/train", **generate)
        test = listops_data.generate_expressions(test_size, "quality/test", **generate)
        if validation_size:
            validation = listops_data.generate_expressions(validation_size, "quality/validation", **generate)
        tokenizer = WhitespaceTokenizer(listops_data.VOCABULARY, length)
        classes = listops_data.NUM_CLASSES
        description = f"ListOps expressions of {length // 2}-{length} tokens (examples/listops_data.py)"
    elif task == "tags":
        import long_range_data

        train = long_range_data.generate_documents(train_size, [0, 0], length)
        test = long_range_data.generate_documents(test_size, [0, 1], length)
        if validation_size:
            validation = long_range_data.generate_documents(validation_size, [0, 2], length)
        tokenizer = WhitespaceTokenizer(long_range_data.VOCABULARY, length)
        classes = len(long_range_data.CLASS_NAMES)
        description = f"built-in tags task, {length}-word documents (examples/long_range_data.py)"
    elif task == "imdb":
        texts, labels = imdb_split("train")
        train_size = len(texts) if train_size is None else train_size
        if train_size + validation_size > len(texts):
            raise ValueError(f"imdb: train_size + validation_size must be <= {len(texts)} (the training "
                             f"reviews), got {train_size} + {validation_size}")
        train, validation = _split(texts, labels, [train_size, validation_size], 0)
        test, = _split(*imdb_split("test"), [test_size], 1)
        tokenizer = ByteTokenizer(length)
        classes = 2
        description = f"IMDB reviews, UTF-8 bytes truncated to {length} ({_imdb_dir()})"
    else:
        raise ValueError(f"unknown classification task {task!r}")
    if task != "imdb":  # imdb's splits are disjoint by construction (and reviews can repeat in the files)
        _check_disjoint(validation[0], train[0], test[0])
    if validation_size:
        description += f", {validation_size} validation"
    return ClassificationData(tokenizer.encode(list(train[0])), np.asarray(train[1], np.int32),
                              tokenizer.encode(list(test[0])), np.asarray(test[1], np.int32),
                              tokenizer.vocab_size, classes, description,
                              tokenizer.encode(list(validation[0])) if validation_size else [],
                              np.asarray(validation[1], np.int32))


# ----------------------------------------------------------------------------- byte-level LM

@functools.lru_cache(maxsize=2)
def imdb_bytes(split):
    """The reviews of an IMDB split as one uint8 array, UTF-8, separated by newlines (the texts keep
    their `<br />` tags)."""
    return _as_bytes(imdb_split(split)[0])


def _as_bytes(texts):
    return np.frombuffer("\n".join(texts).encode("utf-8"), np.uint8)


LM_VALIDATION_REVIEWS = 1000  # training reviews the lm validation split holds out of the training bytes
LM_SPLIT_SEED = 3  # which ones (tasks._split's permutation; imdb's classification splits use 0 and 1)


@functools.lru_cache(maxsize=2)
def lm_data(validation):
    """(train, validation, test) bytes of the byte LM (imdb_bytes' layout). Without `validation`: all
    training reviews, None, the test reviews (the data of every record before the protocol). With it,
    LM_VALIDATION_REVIEWS training reviews (a seeded choice) leave the training bytes for the validation
    bytes, less any whose text is also a training or test review (the files repeat some reviews), so no
    training window reads a validation byte's review and validation never reads a test review."""
    if not validation:
        return imdb_bytes("train"), None, imdb_bytes("test")
    texts, labels = imdb_split("train")
    (train, _), (held, _) = _split(texts, labels, [len(texts) - LM_VALIDATION_REVIEWS, None], LM_SPLIT_SEED)
    test = imdb_split("test")[0]
    seen = set(train) | set(test)
    held = [text for text in held if text not in seen]
    return _as_bytes(train), _as_bytes(held), imdb_bytes("test")


def lm_batch(rng, data, batch_size, length):
    """Random windows of `length + 1` bytes of `data`: (inputs [B, T], next bytes [B, T]) int32."""
    starts = rng.integers(0, len(data) - length - 1, size=batch_size)
    windows = data[starts[:, None] + np.arange(length + 1)].astype(np.int32)
    return windows[:, :-1], windows[:, 1:]


def lm_test_set(data, count, length):
    """`count` windows at evenly spaced offsets of `data` (the held-out test-split reviews)."""
    starts = np.linspace(0, len(data) - length - 1, count).astype(np.int64)
    windows = data[starts[:, None] + np.arange(length + 1)].astype(np.int32)
    return windows[:, :-1], windows[:, 1:]
