"""The LRA sequence classifier shared by long_text_classifier.py (IMDB) and listops.py (ListOps).

Both examples train the Long Range Arena classifier of YOSO's appendix Table 4
(Tay et al. 2021, Xiong et al. 2021): token + learned position embedding ->
`num_layers` pre-LN `keras_yoso.TransformerEncoderBlock`s -> final LayerNorm ->
masked mean pooling -> Dense(ffn_dim, relu) -> Dense(num_classes, softmax).
They differ only in their data and tokenizer. This module holds everything
else: the command-line options of the model and of training, the in-graph
tokenizers (Keras layers over tensorflow-text), the length-bucketed `tf.data`
pipeline, `model.fit`, and the outputs written to `--output-dir`:

    metrics.json   test accuracy and loss, examples/s, peak RSS, all arguments
    history.png    loss and accuracy vs training step, train and validation
    saved_model/   SavedModel whose `serve` signature maps a batch of raw strings
                   (tf.string [batch]) to class probabilities [batch, num_classes]
"""

import dataclasses
import json
import os
import resource
import sys
import time

import keras
import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

import keras_yoso

ATTENTIONS = ("yoso", "yoso_e", "linear_relative", "softmax")
PAD_ID = 0
# Shortest bucket of the length bucketing; each next bucket doubles, up to max_length.
_FIRST_BUCKET_BOUNDARY = 128
_TOKENIZE_BATCH = 1024


# ----------------------------------------------------------------------------- command line

def add_model_arguments(parser, *, lra_task, max_length, hash_code_len, num_hashes):
    """Adds the model and training options, with defaults from the LRA setting of `lra_task` ("Text", ...)."""
    model = parser.add_argument_group("model (defaults: the LRA setting, YOSO appendix Table 4)")
    model.add_argument("--attention", choices=ATTENTIONS, default="yoso",
                       help="self-attention of every encoder block: yoso (YOSO-m, LSH sampling, linear), "
                            "yoso_e (its expectation, O(n^2)), linear_relative (Scaleformer, linear), "
                            "softmax (keras.layers.MultiHeadAttention, O(n^2)). Default: %(default)s")
    model.add_argument("--num-hashes", type=int, default=num_hashes,
                       help=f"m, the number of hashes of YOSO-m. Default: %(default)s, the paper's LRA {lra_task} "
                            "run YOSO-32 (Table 3)")
    model.add_argument("--hash-code-len", type=int, default=hash_code_len,
                       help=f"tau, bits per hash code (attention weight (1 - theta/pi)^tau). Default: %(default)s "
                            f"= log2(LRA {lra_task} length), the authors' LRA configuration (mlpen/YOSO "
                            "LRA/models/yoso-v1-32/config.json); appendix Table 4 gives no tau")
    model.add_argument("--conv-window", type=int, default=None,
                       help="add a depthwise convolution of this window to the YOSO output: YOSO-C "
                            "(paper §4.2; Table 3's YOSO-C-16 is --num-hashes 16 with a convolution). "
                            "Default: none")
    model.add_argument("--num-layers", type=int, default=2, help="encoder blocks. Default: %(default)s")
    model.add_argument("--hidden-dim", type=int, default=64, help="embedding dim. Default: %(default)s")
    model.add_argument("--ffn-dim", type=int, default=128,
                       help="feed-forward and classifier hidden dim. Default: %(default)s")
    model.add_argument("--num-heads", type=int, default=2,
                       help="attention heads (head dim = hidden-dim / num-heads). Default: %(default)s")
    model.add_argument("--dropout", type=float, default=0.1, help="Default: %(default)s")
    model.add_argument("--max-length", type=int, default=max_length,
                       help="tokens kept per sequence (longer ones are truncated). Default: %(default)s")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=1, help="Default: %(default)s")
    train.add_argument("--batch-size", type=int, default=32, help="Default: %(default)s (Table 4)")
    train.add_argument("--learning-rate", type=float, default=1e-4,
                       help="peak Adam learning rate, linear warmup then linear decay to 0. "
                            "Default: %(default)s (Table 4)")
    train.add_argument("--warmup-fraction", type=float, default=0.1,
                       help="fraction of the training steps spent warming up. Default: %(default)s")
    train.add_argument("--validation-fraction", type=float, default=0.1,
                       help="fraction of the training examples held out for validation. Default: %(default)s")
    train.add_argument("--seed", type=int, default=0,
                       help="seeds data order, weights, dropout and hashing. Default: %(default)s")
    train.add_argument("--output-dir", default=None,
                       help="where metrics.json, history.png and saved_model/ go. Default: runs/<task>-<attention>")


def check_model_arguments(parser, args):
    """parser.error() naming the first option with an invalid value."""
    positive = ("num_hashes", "hash_code_len", "num_layers", "hidden_dim", "ffn_dim", "num_heads",
                "max_length", "epochs", "batch_size")
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.conv_window is not None and args.conv_window < 1:
        parser.error(f"--conv-window must be >= 1, got {args.conv_window}")
    if args.conv_window is not None and args.attention != "yoso":
        parser.error(f"--conv-window (YOSO-C) needs --attention yoso, got --attention {args.attention}")
    if args.hidden_dim % args.num_heads:
        parser.error(f"--hidden-dim {args.hidden_dim} must be a multiple of --num-heads {args.num_heads}")
    for name in ("dropout", "validation_fraction", "warmup_fraction"):
        if not 0.0 <= getattr(args, name) < 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    if args.learning_rate <= 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")


def encoder_attention(args):
    """(attention, attention_kwargs) of `TransformerEncoderBlock` for `--attention`."""
    if args.attention == "yoso":
        return "yoso", {"num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len,
                        "conv_window": args.conv_window}
    if args.attention == "yoso_e":
        return "yoso", {"hash_code_len": args.hash_code_len, "use_expectation": True}
    return args.attention, {}


# ----------------------------------------------------------------------------- tokenizers

class _Tokenizer(keras.layers.Layer):
    """Maps a batch of strings `[batch]` to token ids `[batch, length]` (int32, 0 = padding) in the graph.

    `token_ids` gives the ragged ids `[batch, (length)]`, truncated to `max_length`: the
    tf.data pipeline uses them per example, `call` pads them for the serving model.
    """

    def __init__(self, max_length, **kwargs):
        super().__init__(trainable=False, **kwargs)
        self.max_length = max_length

    @property
    def vocab_size(self):
        raise NotImplementedError

    def _ragged_ids(self, texts):
        raise NotImplementedError

    def token_ids(self, texts):
        return tf.cast(self._ragged_ids(texts)[:, :self.max_length], tf.int32)

    def call(self, texts):
        return self.token_ids(texts).to_tensor(PAD_ID)

    def compute_output_spec(self, texts):
        return keras.KerasTensor(tuple(texts.shape) + (None,), dtype="int32")


class ByteTokenizer(_Tokenizer):
    """UTF-8 bytes (the LRA Text setting): id = byte + 1, 0 is padding."""

    @property
    def vocab_size(self):
        return 257

    def _ragged_ids(self, texts):
        return tf.cast(tf_text.ByteSplitter().split(texts), tf.int32) + 1


class WordpieceTokenizer(_Tokenizer):
    """BERT wordpieces (lower-cased, accents stripped) of `vocabulary`, whose entry 0 is the padding token."""

    def __init__(self, vocabulary, max_length, **kwargs):
        super().__init__(max_length, **kwargs)
        self.vocabulary = list(vocabulary)
        self._bert_tokenizer = tf_text.FastBertTokenizer(
            vocab=self.vocabulary, token_out_type=tf.int32, unknown_token="[UNK]",
            lower_case_nfd_strip_accents=True)

    @property
    def vocab_size(self):
        return len(self.vocabulary)

    def _ragged_ids(self, texts):
        return self._bert_tokenizer.tokenize(texts)


class WhitespaceTokenizer(_Tokenizer):
    """Whitespace-separated tokens of a fixed `vocabulary`: id 0 padding, 1 unknown, 2 + i `vocabulary[i]`."""

    def __init__(self, vocabulary, max_length, **kwargs):
        super().__init__(max_length, **kwargs)
        self.vocabulary = list(vocabulary)
        self._lookup = keras.layers.StringLookup(vocabulary=self.vocabulary, mask_token="[PAD]",
                                                 num_oov_indices=1, output_mode="int")

    @property
    def vocab_size(self):
        return len(self.vocabulary) + 2

    def _ragged_ids(self, texts):
        words = tf_text.WhitespaceTokenizer().tokenize(texts)
        return words.with_flat_values(self._lookup(words.flat_values))


# ----------------------------------------------------------------------------- model

@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned embedding of the position, masking padding (id 0)."""

    def __init__(self, vocab_size, max_length, output_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.output_dim = output_dim
        self.token_embedding = keras.layers.Embedding(vocab_size, output_dim, name="token_embedding")
        self.position_embedding = keras.layers.Embedding(max_length, output_dim, name="position_embedding")

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build((input_shape[-1],))

    def call(self, token_ids):
        positions = keras.ops.arange(keras.ops.shape(token_ids)[-1])
        return self.token_embedding(token_ids) + self.position_embedding(positions)[None]

    def compute_mask(self, token_ids, mask=None):
        return keras.ops.not_equal(token_ids, PAD_ID)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "max_length": self.max_length,
                "output_dim": self.output_dim}


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class MaskedMeanPooling(keras.layers.Layer):
    """`[batch, length, dim]` -> `[batch, dim]`: the mean over unmasked positions; zeros when there are none."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return keras.ops.mean(inputs, axis=1)
        weights = keras.ops.cast(mask, inputs.dtype)[:, :, None]
        count = keras.ops.maximum(keras.ops.sum(weights, axis=1), 1.0)  # an empty text pools to zeros, not NaN
        return keras.ops.sum(inputs * weights, axis=1) / count

    def compute_mask(self, inputs, mask=None):
        return None

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[2])


def build_classifier(vocab_size, num_classes, args):
    """token ids `[batch, length]` (int32, 0 = padding) -> class probabilities `[batch, num_classes]`."""
    attention, attention_kwargs = encoder_attention(args)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = TokenAndPositionEmbedding(vocab_size, args.max_length, args.hidden_dim, name="embedding")(token_ids)
    x = keras.layers.Dropout(args.dropout)(x)
    for i in range(args.num_layers):
        x = keras_yoso.TransformerEncoderBlock(
            args.num_heads, args.ffn_dim, attention=attention,
            attention_kwargs={**attention_kwargs, "seed": args.seed * 1000 + i + 1},
            dropout=args.dropout, norm_first=True, name=f"encoder_{i}")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    x = MaskedMeanPooling(name="masked_mean")(x)
    x = keras.layers.Dense(args.ffn_dim, activation="relu", name="classifier_hidden")(x)
    probabilities = keras.layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    return keras.Model(token_ids, probabilities, name="lra_classifier")


def build_serving_model(tokenizer, classifier):
    """raw strings `[batch]` (tf.string) -> class probabilities, tokenization in the graph."""
    texts = keras.Input((), dtype="string", name="texts")
    return keras.Model(texts, classifier(tokenizer(texts)), name="serving_model")


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class LinearWarmupLinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Rises linearly to `peak` over `warmup_steps`, then falls linearly to 0 at `total_steps` (Table 4)."""

    def __init__(self, peak, warmup_steps, total_steps):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = keras.ops.minimum(1.0, (step + 1.0) / max(self.warmup_steps, 1))
        decay = keras.ops.clip((self.total_steps - step) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        return self.peak * keras.ops.minimum(warmup, decay)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


# ----------------------------------------------------------------------------- data

@dataclasses.dataclass
class Split:
    """Texts and integer labels of one split."""

    texts: list
    labels: np.ndarray

    def __post_init__(self):
        self.labels = np.asarray(self.labels, np.int32)
        if len(self.labels) != len(self.texts):
            raise ValueError(f"{len(self.texts)} texts but {len(self.labels)} labels")

    def __len__(self):
        return len(self.texts)

    def subset(self, indices):
        return Split([self.texts[i] for i in indices], self.labels[indices])


def hold_out(train, fraction, seed):
    """(train, validation): a seeded random `fraction` of `train` held out, at least one example each."""
    if len(train) < 2:
        raise ValueError(f"need at least 2 training examples to hold out a validation split, got {len(train)}")
    order = np.random.default_rng(seed).permutation(len(train))
    num_validation = min(max(1, round(fraction * len(train))), len(train) - 1)
    return train.subset(np.sort(order[num_validation:])), train.subset(np.sort(order[:num_validation]))


def bucket_boundaries(max_length):
    """Upper length bounds of the buckets: 128, 256, ... below max_length (the last bucket takes the rest)."""
    boundaries, boundary = [], _FIRST_BUCKET_BOUNDARY
    while boundary < max_length:
        boundaries.append(boundary)
        boundary *= 2
    return boundaries


def _token_dataset(split, tokenizer):
    """Dataset of (token ids [length], label), tokenized in the graph in batches, cached."""
    dataset = tf.data.Dataset.from_tensor_slices((tf.constant(split.texts, tf.string),
                                                  tf.constant(split.labels, tf.int32)))
    dataset = dataset.batch(_TOKENIZE_BATCH).map(lambda texts, labels: (tokenizer.token_ids(texts), labels))
    # Unbatched rows of a RaggedTensor are ragged_rank-0 RaggedTensors; an identity map makes them Tensors.
    return dataset.unbatch().map(lambda ids, label: (ids, label)).cache()


def batched_dataset(split, tokenizer, batch_size, shuffle_seed=None):
    """(dataset, batches per pass): length-bucketed batches padded to their longest sequence.

    With `shuffle_seed`, the examples are reshuffled on every pass. The number of batches is
    counted in advance and declared, so Keras knows the epoch length (and the progress bar its end).
    """
    tokens = _token_dataset(split, tokenizer)
    lengths = np.fromiter((len(ids) for ids, _ in tokens.as_numpy_iterator()), np.int64, len(split))
    boundaries = bucket_boundaries(tokenizer.max_length)
    counts = np.bincount(np.searchsorted(boundaries, lengths, side="right"), minlength=len(boundaries) + 1)
    num_batches = int(sum(-(-count // batch_size) for count in counts))
    if shuffle_seed is not None:
        tokens = tokens.shuffle(len(split), seed=shuffle_seed, reshuffle_each_iteration=True)
    batches = tokens.bucket_by_sequence_length(
        lambda ids, label: tf.shape(ids)[0], boundaries, [batch_size] * (len(boundaries) + 1),
        padding_values=(PAD_ID, 0))
    batches = batches.apply(tf.data.experimental.assert_cardinality(num_batches))
    return batches.prefetch(tf.data.AUTOTUNE), num_batches


# ----------------------------------------------------------------------------- training

class _TrainTimer(keras.callbacks.Callback):
    """Wall and process CPU seconds spent training: from each epoch's start to its validation."""

    def __init__(self):
        super().__init__()
        self.seconds = self.cpu_seconds = 0.0
        self._epoch_start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = (time.perf_counter(), process_cpu_seconds())

    def on_test_begin(self, logs=None):
        if self._epoch_start is not None:
            self.seconds += time.perf_counter() - self._epoch_start[0]
            self.cpu_seconds += process_cpu_seconds() - self._epoch_start[1]
            self._epoch_start = None

    def on_epoch_end(self, epoch, logs=None):
        self.on_test_begin()


class _StepHistory(keras.callbacks.Callback):
    """Training loss and accuracy every `every` steps: Keras' running means over the epoch so far."""

    def __init__(self, every):
        super().__init__()
        self.every, self.step = max(1, every), 0
        self.record = {"step": [], "loss": [], "accuracy": []}

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step % self.every == 0 and logs:
            self.record["step"].append(self.step)
            self.record["loss"].append(float(logs["loss"]))
            self.record["accuracy"].append(float(logs["accuracy"]))


def process_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib():
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def plot_history(history, steps, steps_per_epoch, path, title):
    """Loss and accuracy vs training step: the running training means of `steps` (a
    _StepHistory record) and the validation values at the end of each epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epoch_ends = steps_per_epoch * np.arange(1, len(history["loss"]) + 1)
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for axis, metric in zip(axes, ("loss", "accuracy")):
        if steps["step"]:
            axis.plot(steps["step"], steps[metric], "-", label="train (running mean over the epoch)")
        axis.plot(epoch_ends, history[metric], "o", color="C0", label="train, end of epoch")
        if f"val_{metric}" in history:
            axis.plot(epoch_ends, history[f"val_{metric}"], "s-", color="C1", label="validation")
        axis.set_xlabel(f"training step ({steps_per_epoch} per epoch)")
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


@dataclasses.dataclass
class RunResult:
    metrics: dict
    classifier: keras.Model
    serving_model: keras.Model
    output_dir: str


def train_and_export(task, args, tokenizer, class_names, train, validation, test):
    """Trains with model.fit, evaluates on `test`, writes the outputs to `args.output_dir`; a RunResult."""
    os.makedirs(args.output_dir, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    train_batches, train_steps = batched_dataset(train, tokenizer, args.batch_size, shuffle_seed=args.seed)
    validation_batches, _ = batched_dataset(validation, tokenizer, args.batch_size)
    test_batches, _ = batched_dataset(test, tokenizer, args.batch_size)

    classifier = build_classifier(tokenizer.vocab_size, len(class_names), args)
    total_steps = train_steps * args.epochs
    schedule = LinearWarmupLinearDecay(args.learning_rate, round(args.warmup_fraction * total_steps), total_steps)
    # No XLA: bucketed batches have many lengths, and the custom ops run outside XLA anyway.
    classifier.compile(optimizer=keras.optimizers.Adam(schedule), loss="sparse_categorical_crossentropy",
                       metrics=["accuracy"], jit_compile=False)
    timer = _TrainTimer()
    step_history = _StepHistory(every=total_steps // 200)
    print(f"{task}: {len(train)} train / {len(validation)} validation / {len(test)} test examples, "
          f"{train_steps} batches per epoch, attention={args.attention}, "
          f"{classifier.count_params():,} parameters, custom ops: {keras_yoso.ops.custom_ops_available()}",
          flush=True)
    fit = classifier.fit(train_batches, validation_data=validation_batches, epochs=args.epochs, shuffle=False,
                         callbacks=[timer, step_history])
    history = {name: [float(v) for v in values] for name, values in fit.history.items()}

    start, start_cpu = time.perf_counter(), process_cpu_seconds()
    test_loss, test_accuracy = classifier.evaluate(test_batches, verbose=0)
    test_seconds, test_cpu_seconds = time.perf_counter() - start, process_cpu_seconds() - start_cpu

    serving_model = build_serving_model(tokenizer, classifier)
    export_dir = os.path.join(args.output_dir, "saved_model")
    serving_model.export(export_dir, format="tf_saved_model", verbose=False)
    labels_dir = os.path.join(export_dir, "assets.extra")
    os.makedirs(labels_dir, exist_ok=True)
    with open(os.path.join(labels_dir, "labels.txt"), "w", encoding="utf-8") as f:
        f.write("".join(f"{name}\n" for name in class_names))

    metrics = {
        "task": task,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "validation_accuracy": history["val_accuracy"][-1],
        "validation_loss": history["val_loss"][-1],
        "train_examples_per_second": len(train) * args.epochs / max(timer.seconds, 1e-9),
        "test_examples_per_second": len(test) / max(test_seconds, 1e-9),
        "train_seconds": timer.seconds,
        "train_cpu_seconds": timer.cpu_seconds,
        "test_seconds": test_seconds,
        "test_cpu_seconds": test_cpu_seconds,
        "peak_rss_mib": peak_rss_mib(),
        "process_cpu_seconds": process_cpu_seconds(),
        "num_train_examples": len(train),
        "num_validation_examples": len(validation),
        "num_test_examples": len(test),
        "batches_per_epoch": train_steps,
        "num_parameters": int(classifier.count_params()),
        "custom_ops": keras_yoso.ops.custom_ops_available(),
        "class_names": list(class_names),
        "history": history,
        "step_history": step_history.record,
        "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                     "tensorflow_text": tf_text.__version__, "keras_yoso": keras_yoso.__version__},
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "args": vars(args),
    }
    with open(os.path.join(args.output_dir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    plot_history(history, step_history.record, train_steps, os.path.join(args.output_dir, "history.png"),
                 f"{task}, attention={args.attention}")
    print(f"{task} attention={args.attention}: test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) on "
          f"{len(test)} examples | train {metrics['train_examples_per_second']:.1f} examples/s, "
          f"test {metrics['test_examples_per_second']:.1f} examples/s, peak RSS "
          f"{metrics['peak_rss_mib']:.0f} MiB | {args.output_dir}", flush=True)
    return RunResult(metrics, classifier, serving_model, args.output_dir)


def parse_args(parser, argv):
    """Parsed arguments; parser.error() (exit 2) naming the first invalid model or training option."""
    args = parser.parse_args(argv)
    check_model_arguments(parser, args)
    return args

