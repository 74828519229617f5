"""The LRA sequence classifier shared by long_text_classifier.py and listops.py, on every Keras backend.

Both examples train the Long Range Arena classifier of YOSO's appendix Table 4 (Tay et al. 2021):
token + learned position embedding -> `num_layers` pre-LN `keras_yoso.TransformerEncoderBlock`s ->
final LayerNorm -> masked mean pooling -> Dense(ffn_dim, relu) -> Dense(num_classes, softmax).
They differ only in their data and tokenizer. This module holds everything else:

- the command-line options of the model and of training (`--preset lra`: appendix Table 4);
- tokenizers to NumPy token ids (bytes, whitespace words; wordpiece needs tensorflow-text);
- length-bucketed batches (`keras.utils.PyDataset`): the batch of training step s is a fixed
  function of --seed and s, so training split into pieces (`--checkpoint-dir`,
  `--stop-after-steps`) is the same training as one run;
- `model.fit` in intervals of --eval-every steps, with validation after each, checkpoints, and
  the outputs written to --output-dir;
- `--mesh data=D,seq=S` (scripts that call `add_mesh_argument`; JAX only): the same training
  run data and sequence parallel on D*S devices under `keras_yoso.distribution.SequenceParallel`
  (`mesh_distribution`). The outputs:

    model.keras    the trained classifier, every backend (keras.saving.load_model)
    metrics.json   test accuracy and loss, examples/s, peak RSS, validation history, all arguments
    history.png    loss and accuracy vs training step (train: mean per interval; validation); a warning
                   instead when matplotlib is missing
    saved_model/   TensorFlow backend only: `serve` maps raw strings to class probabilities
                   (examples/text_serving.py), by default portable (no keras_yoso needed to serve)

Runs on TensorFlow, JAX and PyTorch (KERAS_BACKEND); TensorFlow's C++ start-up logs are silenced
unless --verbose.
"""

import os
import sys

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402


@contextlib.contextmanager
def _native_stderr_silenced(silence):
    """Sends file descriptor 2 to /dev/null while TensorFlow loads: its C++ start-up lines ("All log messages
    before absl::InitializeLog()", "Could not find cuda drivers") are written before TF_CPP_MIN_LOG_LEVEL is
    read. Python's own errors are unaffected: they print after the descriptor is restored."""
    if not silence:
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


with _native_stderr_silenced("--verbose" not in sys.argv):  # TensorFlow may be Keras' backend
    import keras  # noqa: E402
    import numpy as np  # noqa: E402

    import keras_yoso  # noqa: E402

    if keras.backend.backend() == "tensorflow":  # its device set-up logs ("failed call to cuInit") come at first use
        keras.ops.convert_to_numpy(keras.ops.zeros(()))

ATTENTIONS = ("yoso", "yoso_e", "linear_relative", "softmax", "none")
PAD_ID = 0
# keras.layers.Embedding's default initializer draws uniformly in +-0.05.
_EMBEDDING_INIT_LIMIT = 0.05
# Shortest bucket of the length bucketing; each next bucket doubles, up to max_length.
_FIRST_BUCKET_BOUNDARY = 128
# The training options a checkpoint must agree with to be continued.
_RESUME_KEYS = ("attention", "num_hashes", "hash_code_len", "conv_window", "backward", "num_layers", "hidden_dim",
                "embedding_scale", "ffn_dim", "num_heads", "dropout", "max_length", "steps", "batch_size", "learning_rate",
                "warmup_steps", "validation_fraction", "seed", "eval_every", "mesh")


# ----------------------------------------------------------------------------- command line

def add_model_arguments(parser, *, lra_task, max_length, hash_code_len, num_hashes, lra_preset):
    """Adds the model, training and run options (defaults: the LRA setting of `lra_task`)."""
    model = parser.add_argument_group("model (defaults: the LRA setting, YOSO appendix Table 4)")
    model.add_argument("--attention", choices=ATTENTIONS, default="yoso",
                       help="self-attention of every encoder block: yoso (YOSO-m, LSH sampling, linear), "
                            "yoso_e (its expectation, O(n^2)), linear_relative (Scaleformer, linear), "
                            "softmax (keras.layers.MultiHeadAttention, O(n^2)), none (no encoder blocks: "
                            "pooling of per-token features only, a baseline). Default: %(default)s")
    model.add_argument("--num-hashes", type=int, default=num_hashes,
                       help=f"m, the number of hashes of YOSO-m. Default: %(default)s, the paper's LRA {lra_task} "
                            "run YOSO-32 (Table 3)")
    model.add_argument("--hash-code-len", type=int, default=hash_code_len,
                       help="tau, bits per hash code (attention weight (1 - theta/pi)^tau). Default: %(default)s")
    model.add_argument("--conv-window", type=int, default=None,
                       help="add a depthwise convolution of this window to the YOSO output: YOSO-C (paper §4.2). "
                            "Default: none")
    model.add_argument("--backward", choices=("lower_bound", "collision"), default="lower_bound",
                       help="YOSO's gradient estimator: lower_bound (eq. 4, YOSO) or collision (*YOSO). "
                            "Default: %(default)s")
    model.add_argument("--num-layers", type=int, default=2, help="encoder blocks. Default: %(default)s")
    model.add_argument("--hidden-dim", type=int, default=64, help="embedding dim. Default: %(default)s")
    model.add_argument("--ffn-dim", type=int, default=128,
                       help="feed-forward and classifier hidden dim. Default: %(default)s")
    model.add_argument("--num-heads", type=int, default=2,
                       help="attention heads (head dim = hidden-dim / num-heads). Default: %(default)s")
    model.add_argument("--dropout", type=float, default=0.1, help="Default: %(default)s")
    model.add_argument("--embedding-scale", type=float, default=1.0,
                       help="s: the token + position embedding is s * (E[token] + P[position]) with E, P initialized "
                            "in +-0.05/s: the same initial model, with s times Adam's learning rate for the "
                            "embeddings. Default: %(default)s")
    model.add_argument("--max-length", type=int, default=max_length,
                       help="tokens kept per sequence (longer ones are truncated). Default: %(default)s")
    train = parser.add_argument_group("training")
    train.add_argument("--preset", choices=("lra",), default=None,
                       help="lra: the paper's LRA training of this task, appendix Table 4: "
                            + ", ".join(f"{key.replace('_', '-')} {value}" for key, value in lra_preset.items())
                            + ". Explicit options still win.")
    train.add_argument("--steps", type=int, default=None,
                       help="optimizer steps in all (batches). Default: --epochs passes over the training split")
    train.add_argument("--epochs", type=int, default=1, help="passes over the training split when --steps is not "
                                                             "given. Default: %(default)s")
    train.add_argument("--batch-size", type=int, default=32,
                       help="Default: %(default)s (the LRA value of Table 4 is 32: --preset lra)")
    train.add_argument("--learning-rate", type=float, default=1e-4,
                       help="peak Adam learning rate, linear warmup then linear decay to 0. "
                            "Default: %(default)s (the LRA value of Table 4 is 1e-4: --preset lra)")
    train.add_argument("--warmup-steps", type=int, default=None,
                       help="steps of linear warmup. Default: --warmup-fraction of the steps")
    train.add_argument("--warmup-fraction", type=float, default=0.1,
                       help="fraction of the steps spent warming up when --warmup-steps is not given. "
                            "Default: %(default)s")
    train.add_argument("--validation-fraction", type=float, default=0.1,
                       help="fraction of the training examples held out for validation. Default: %(default)s")
    train.add_argument("--eval-every", type=int, default=None,
                       help="evaluate on the validation split every N steps (and at the end); the history "
                            "records each. Default: %(default)s (None: about 10 evaluations per run)")
    train.add_argument("--seed", type=int, default=0,
                       help="seeds data order, weights, dropout and hashing. Default: %(default)s")
    run = parser.add_argument_group("run, resume, outputs")
    run.add_argument("--checkpoint-dir", default=None,
                     help="save the training state here (model, optimizer, RNG states, history) at every "
                          "evaluation and when stopping; a rerun of the same command continues from it")
    run.add_argument("--stop-after-steps", type=int, default=None,
                     help="train at most this many more steps in this invocation, save the checkpoint "
                          "(needs --checkpoint-dir) and exit 0; the outputs are written when --steps is reached")
    run.add_argument("--output-dir", default=None,
                     help="where model.keras, metrics.json, history.png and (TensorFlow) saved_model/ go. "
                          "Default: runs/<task>-<attention>-<Keras backend>")
    run.add_argument("--export", choices=("portable", "custom_op", "none"), default="portable",
                     help="TensorFlow backend: the SavedModel of raw strings. portable: YOSO runs on the composite "
                          "in the graph, so it serves with TensorFlow and tensorflow-text alone (no keras_yoso); "
                          "custom_op: the C++ kernels, faster, and the serving process must `import keras_yoso` "
                          "before loading (docs/benchmarks.md measures both). Default: %(default)s")
    run.add_argument("--verbose", action="store_true", help="keep TensorFlow's C++ start-up logs")


def default_output_dir(task, attention):
    """runs/<task>-<attention>-<backend>: runs of different backends never overwrite each other."""
    return os.path.join("runs", f"{task}-{attention}-{keras.backend.backend()}")


def _progress_every(args):
    """Steps between progress lines: about 5 lines per evaluation interval, at least every 10 steps."""
    return max(1, min(10, args.eval_every // 5))


def check_model_arguments(parser, args):
    """parser.error() naming the first option with an invalid value."""
    positive = ("num_hashes", "hash_code_len", "num_layers", "hidden_dim", "ffn_dim", "num_heads", "max_length",
                "epochs", "batch_size")
    for name in positive + ("steps", "eval_every", "stop_after_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.conv_window is not None and args.conv_window < 1:
        parser.error(f"--conv-window must be >= 1, got {args.conv_window}")
    if args.conv_window is not None and args.attention != "yoso":
        parser.error(f"--conv-window (YOSO-C) needs --attention yoso, got --attention {args.attention}")
    if args.hidden_dim % args.num_heads:
        parser.error(f"--hidden-dim {args.hidden_dim} must be a multiple of --num-heads {args.num_heads}")
    for name in ("dropout", "validation_fraction", "warmup_fraction"):
        if not 0.0 <= getattr(args, name) < 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    if args.embedding_scale <= 0:
        parser.error(f"--embedding-scale must be > 0, got {args.embedding_scale}")
    if args.learning_rate <= 0:
        parser.error(f"--learning-rate must be > 0, got {args.learning_rate}")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        parser.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.stop_after_steps is not None and args.checkpoint_dir is None:
        parser.error("--stop-after-steps needs --checkpoint-dir (where the next invocation continues from)")


def parse_args(parser, argv, lra_preset):
    """Parsed arguments, with --preset lra filling the options not given explicitly; parser.error()
    (exit 2) naming the first invalid option."""
    args = parser.parse_args(argv)
    if args.preset == "lra":
        parser.set_defaults(**lra_preset)
        args = parser.parse_args(argv)
    check_model_arguments(parser, args)
    if getattr(args, "mesh", None) is not None:
        check_mesh_arguments(parser, args)
    return args


# ----------------------------------------------------------------------------- device mesh (JAX)

# The user-facing axis names of --mesh and the keras.distribution.DeviceMesh axes they become.
MESH_AXES = {"data": "batch", "seq": "seq"}
DISTRIBUTED_DOC = "docs/distributed.md"


def add_mesh_argument(parser):
    """--mesh data=D,seq=S: data and sequence parallel training on D*S devices (JAX)."""
    group = parser.add_argument_group("devices (JAX)")
    group.add_argument("--mesh", default=None, metavar="data=D,seq=S",
                       help="train data and sequence parallel on a D x S device mesh "
                            "(keras_yoso.distribution.SequenceParallel; KERAS_BACKEND=jax): each batch is split in D "
                            "row blocks and each sequence in S blocks; --batch-size must be a multiple of D, "
                            "--max-length of S. An axis left out is 1. With fewer devices than D*S on CPU, the script "
                            "makes D*S virtual CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count). "
                            f"Default: one device. TensorFlow / PyTorch: see {DISTRIBUTED_DOC}")


def parse_mesh(text):
    """{"data": D, "seq": S} of a --mesh value such as "data=2,seq=4" (an axis left out is 1);
    ValueError saying what is wrong."""
    sizes = {}
    for item in text.split(","):
        name, equals, value = item.strip().partition("=")
        name = name.strip()
        if not equals or name not in MESH_AXES:
            raise ValueError(f"{item.strip()!r} is not an axis: write data=D,seq=S (axes {', '.join(MESH_AXES)})")
        if name in sizes:
            raise ValueError(f"the axis {name} is given twice")
        try:
            sizes[name] = int(value)
        except ValueError:
            raise ValueError(f"{name}={value.strip()!r}: the number of devices must be an integer") from None
        if sizes[name] < 1:
            raise ValueError(f"{name}={sizes[name]}: the number of devices must be >= 1")
    return {name: sizes.get(name, 1) for name in MESH_AXES}


def _mesh_text(sizes):
    return ",".join(f"{name}={size}" for name, size in sizes.items())


def check_mesh_arguments(parser, args):
    """parser.error() unless --mesh can run: a well-formed mesh, --max-length a multiple of seq,
    --batch-size of data, the JAX backend, and data*seq devices (virtual CPU devices are asked for
    when JAX has not started yet). Normalizes args.mesh to "data=D,seq=S"."""
    try:
        sizes = parse_mesh(args.mesh)
    except ValueError as error:
        parser.error(f"--mesh {args.mesh}: {error}")
    args.mesh = _mesh_text(sizes)
    if args.max_length % sizes["seq"]:
        parser.error(f"--max-length {args.max_length} must be a multiple of the seq axis of --mesh {args.mesh} "
                     f"({sizes['seq']}): each sequence is split in {sizes['seq']} equal blocks")
    if args.batch_size % sizes["data"]:
        parser.error(f"--batch-size {args.batch_size} must be a multiple of the data axis of --mesh {args.mesh} "
                     f"({sizes['data']}): each batch is split in {sizes['data']} equal row blocks")
    if keras.backend.backend() != "jax":
        parser.error(f"--mesh (sequence parallelism, keras_yoso.distribution.SequenceParallel) needs KERAS_BACKEND=jax, "
                     f"this is KERAS_BACKEND={keras.backend.backend()}. For data parallel training on TensorFlow "
                     f"(tf.distribute) or PyTorch (DistributedDataParallel), see {DISTRIBUTED_DOC}")
    count = sizes["data"] * sizes["seq"]
    devices = mesh_devices(count)
    if len(devices) < count:
        platform = devices[0].platform if devices else "?"
        hint = (f" JAX had started before the script could ask for {count} virtual CPU devices: set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={count} in the environment before Python imports "
                "jax (run as a script, long_text_classifier.py does this itself)." if platform == "cpu" else "")
        parser.error(f"--mesh {args.mesh} needs {sizes['data']} x {sizes['seq']} = {count} devices, JAX has "
                     f"{len(devices)} ({platform}).{hint}")


def mesh_devices(count):
    """JAX's devices, after asking for `count` virtual CPU devices if JAX has not started yet and
    XLA_FLAGS does not say how many (on a GPU machine the CPU count is unused)."""
    import jax

    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        try:
            if jax.config.jax_num_cpu_devices < count:
                jax.config.update("jax_num_cpu_devices", count)
        except (RuntimeError, AttributeError):  # JAX's backends are up already (or an older JAX): count as they are
            pass
    return jax.devices()


def mesh_distribution(args):
    """The `keras_yoso.distribution.SequenceParallel` of --mesh (axes "batch" and "seq" of a
    keras.distribution.DeviceMesh on the first data*seq devices), or None without --mesh."""
    if getattr(args, "mesh", None) is None:
        return None
    sizes = parse_mesh(args.mesh)
    count = sizes["data"] * sizes["seq"]
    mesh = keras.distribution.DeviceMesh((sizes["data"], sizes["seq"]), [MESH_AXES[name] for name in sizes],
                                         keras.distribution.list_devices()[:count])
    return keras_yoso.distribution.SequenceParallel(mesh, batch_dim_name="batch", sequence_dim_name="seq")


def mesh_rows(args):
    """Rows of a batch must be a multiple of this: the data axis of --mesh (1 without)."""
    return parse_mesh(args.mesh)["data"] if getattr(args, "mesh", None) else 1


def mesh_length_multiple(args):
    """Padded lengths must be a multiple of this: the seq axis of --mesh (1 without)."""
    return parse_mesh(args.mesh)["seq"] if getattr(args, "mesh", None) else 1


def encoder_attention(args):
    """(attention, attention_kwargs) of `TransformerEncoderBlock` for `--attention`."""
    if args.attention == "yoso":
        return "yoso", {"num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len,
                        "conv_window": args.conv_window, "backward": args.backward}
    if args.attention == "yoso_e":
        return "yoso", {"hash_code_len": args.hash_code_len, "use_expectation": True}
    return args.attention, {}


# ----------------------------------------------------------------------------- tokenizers

class ByteTokenizer:
    """UTF-8 bytes (the LRA Text setting): id = byte + 1, 0 is padding."""

    kind = "bytes"
    vocab_size = 257

    def __init__(self, max_length):
        self.max_length = max_length

    def encode(self, texts):
        """A list of int32 id arrays, one per text, truncated to max_length."""
        return [np.frombuffer(text.encode("utf-8")[:self.max_length], np.uint8).astype(np.int32) + 1
                for text in texts]

    def serving_config(self):
        return {"kind": self.kind, "max_length": self.max_length}


class WhitespaceTokenizer:
    """Whitespace-separated words of a fixed `vocabulary`: id 0 padding, 1 unknown, 2 + i `vocabulary[i]`."""

    kind = "whitespace"

    def __init__(self, vocabulary, max_length):
        self.vocabulary = list(vocabulary)
        self.max_length = max_length
        self._ids = {word: index + 2 for index, word in enumerate(self.vocabulary)}

    @property
    def vocab_size(self):
        return len(self.vocabulary) + 2

    def encode(self, texts):
        return [np.fromiter((self._ids.get(word, 1) for word in text.split()[:self.max_length]), np.int32)
                for text in texts]

    def serving_config(self):
        return {"kind": self.kind, "max_length": self.max_length, "vocabulary": self.vocabulary}


class WordpieceTokenizer:
    """BERT wordpieces (lower-cased, accents stripped) of `vocabulary`, whose entry 0 is the padding
    token. Tokenizes with tensorflow-text, so it needs TensorFlow installed (any Keras backend)."""

    kind = "wordpiece"

    def __init__(self, vocabulary, max_length):
        import tensorflow as tf
        import tensorflow_text as tf_text

        self.vocabulary = list(vocabulary)
        self.max_length = max_length
        self._tf = tf
        self._tokenizer = tf_text.FastBertTokenizer(vocab=self.vocabulary, token_out_type=tf.int32,
                                                    unknown_token="[UNK]", lower_case_nfd_strip_accents=True)

    @property
    def vocab_size(self):
        return len(self.vocabulary)

    def encode(self, texts, batch=1024):
        ids = []
        for start in range(0, len(texts), batch):
            ragged = self._tokenizer.tokenize(self._tf.constant(texts[start:start + batch]))[:, :self.max_length]
            ids += [np.asarray(row, np.int32) for row in ragged.to_list()]
        return ids

    def serving_config(self):
        return {"kind": self.kind, "max_length": self.max_length, "vocabulary": self.vocabulary}


# ----------------------------------------------------------------------------- model

@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned embedding of the position, masking padding (id 0).

    `scale` s: the output is s * (token + position embedding) with both tables initialized
    uniform in +-0.05 / s, so the initial outputs are those of Keras' default Embedding for any s,
    while Adam (whose steps do not depend on the gradient's scale) moves the outputs s times
    faster: the embeddings' learning rate is s times the model's.
    """

    def __init__(self, vocab_size, max_length, output_dim, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.max_length = max_length
        self.output_dim = output_dim
        self.scale = float(scale)
        limit = _EMBEDDING_INIT_LIMIT / self.scale
        self.token_embedding = keras.layers.Embedding(
            vocab_size, output_dim, embeddings_initializer=keras.initializers.RandomUniform(-limit, limit),
            name="token_embedding")
        self.position_embedding = keras.layers.Embedding(
            max_length, output_dim, embeddings_initializer=keras.initializers.RandomUniform(-limit, limit),
            name="position_embedding")

    def build(self, input_shape):
        self.token_embedding.build(input_shape)
        self.position_embedding.build((input_shape[-1],))

    def call(self, token_ids):
        # Eagerly, an id outside [0, vocab_size) raises ValueError (JAX's Embedding would give NaN);
        # inside compiled fit/predict nothing is checked (the tokenizers give ids in range).
        keras_yoso.check_token_ids(token_ids, self.vocab_size)
        positions = keras.ops.arange(keras.ops.shape(token_ids)[-1])
        return self.scale * (self.token_embedding(token_ids) + self.position_embedding(positions)[None])

    def compute_mask(self, token_ids, mask=None):
        return keras.ops.not_equal(token_ids, PAD_ID)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "max_length": self.max_length,
                "output_dim": self.output_dim, "scale": self.scale}


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
    x = TokenAndPositionEmbedding(vocab_size, args.max_length, args.hidden_dim, scale=args.embedding_scale,
                                  name="embedding")(token_ids)
    x = keras.layers.Dropout(args.dropout, seed=args.seed)(x)  # seeded: on PyTorch, unseeded masks are not resumable
    if attention == "none":  # the pooling-only baseline: per-token features, no token sees another
        x = keras.layers.Dense(args.ffn_dim, activation="gelu", name="token_features")(x)
    for i in range(args.num_layers if attention != "none" else 0):
        x = keras_yoso.TransformerEncoderBlock(
            args.num_heads, args.ffn_dim, attention=attention,
            attention_kwargs={**attention_kwargs, "seed": args.seed * 1000 + i + 1},
            dropout=args.dropout, norm_first=True, name=f"encoder_{i}")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    x = MaskedMeanPooling(name="masked_mean")(x)
    x = keras.layers.Dense(args.ffn_dim, activation="relu", name="classifier_hidden")(x)
    probabilities = keras.layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    return keras.Model(token_ids, probabilities, name="lra_classifier")


@keras.saving.register_keras_serializable(package="keras_yoso_examples")
class DenseGradientAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` that takes every gradient as a dense tensor, so it does the same math
    on every backend.

    On TensorFlow, the gradient of an `Embedding` reaches the optimizer as `tf.IndexedSlices`
    holding one row per token occurrence. Keras' Adam updates its moments row by row from those
    slices, so the second moment of a token seen c times in a batch sums c squared gradients
    instead of squaring their sum: frequent tokens step up to sqrt(c) times further than Adam's
    learning rate allows (measured on the built-in task: about 5x). JAX and PyTorch hand Adam the
    dense sum. Densifying the slices first gives every backend the textbook Adam update.
    """

    def apply(self, grads, trainable_variables=None):
        return super().apply([_dense(g) for g in grads], trainable_variables)


def _dense(gradient):
    """A TensorFlow `IndexedSlices` as the dense tensor it sums to (repeated rows added); any other
    gradient unchanged."""
    if gradient is not None and hasattr(gradient, "indices") and hasattr(gradient, "dense_shape"):
        import tensorflow as tf

        return tf.convert_to_tensor(gradient)
    return gradient


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


def bucket_boundaries(max_length, multiple=1):
    """Upper length bounds of the buckets: 128, 256, ... and max_length (the last bucket), each
    rounded up to a multiple of `multiple` (the seq axis of --mesh; max_length is one already)."""
    boundaries, boundary = [], _FIRST_BUCKET_BOUNDARY
    while boundary < max_length:
        rounded = -(-boundary // multiple) * multiple
        if rounded < max_length and (not boundaries or rounded > boundaries[-1]):
            boundaries.append(rounded)
        boundary *= 2
    return boundaries + [max_length]


class Batches(keras.utils.PyDataset):
    """Length-bucketed batches of token ids, padded to their bucket's upper bound (few distinct shapes,
    so compiled steps are reused), as (ids [batch, bound] int32, labels [batch] int32).

    Training (`seed` given): pass p over the data shuffles each bucket and the order of all batches
    with NumPy generators seeded by (seed, p); item i is the batch of global step first_step + i, so
    any range of steps can be taken in any invocation. Evaluation (`seed` None): one pass in a
    fixed order.

    On a device mesh (--mesh) every batch must split evenly over the data axis: `row_multiple`.
    A training batch of a bucket's last few examples is then cut to a multiple of it (each pass's
    shuffle picks the examples cut; a bucket of fewer than `row_multiple` examples is not trained);
    an evaluation batch is padded with rows of padding to a multiple of it (`real_rows` says how
    many rows of item i are examples). Bucket lengths are multiples of `length_multiple` (the seq axis).
    """

    def __init__(self, token_ids, labels, batch_size, max_length, seed=None, first_step=0, num_steps=None,
                 row_multiple=1, length_multiple=1):
        super().__init__(workers=1, use_multiprocessing=False)
        self.token_ids, self.labels = token_ids, np.asarray(labels, np.int32)
        self.batch_size, self.seed, self.first_step = batch_size, seed, first_step
        self.row_multiple = row_multiple
        self.boundaries = bucket_boundaries(max_length, length_multiple)
        lengths = np.array([max(1, len(ids)) for ids in token_ids])
        self.bucket_of = np.searchsorted(self.boundaries, lengths, side="left")
        self._pass = None
        self.batches_per_pass = len(self._batches_of_pass(0))
        self.num_steps = self.batches_per_pass if num_steps is None else num_steps

    def _batches_of_pass(self, index):
        """[(bucket, example indices)] of pass `index`, in the order they are trained."""
        if self._pass is not None and self._pass[0] == index:
            return self._pass[1]
        rng = np.random.default_rng([self.seed, index]) if self.seed is not None else None
        batches = []
        for bucket in range(len(self.boundaries)):
            members = np.flatnonzero(self.bucket_of == bucket)
            if rng is not None:
                members = rng.permutation(members)
            batches += [(bucket, members[i:i + self.batch_size]) for i in range(0, len(members), self.batch_size)]
        if rng is not None and self.row_multiple > 1:  # training on a mesh: whole row blocks only
            batches = [(bucket, members[:len(members) - len(members) % self.row_multiple])
                       for bucket, members in batches if len(members) >= self.row_multiple]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        self._pass = (index, batches)
        return batches

    def __len__(self):
        return self.num_steps

    def __getitem__(self, item):
        step = self.first_step + item
        bucket, members = self._batches_of_pass(step // self.batches_per_pass)[step % self.batches_per_pass]
        rows = -(-len(members) // self.row_multiple) * self.row_multiple  # padded rows: evaluation on a mesh
        ids = np.full((rows, self.boundaries[bucket]), PAD_ID, np.int32)
        for row, index in enumerate(members):
            ids[row, :len(self.token_ids[index])] = self.token_ids[index]
        labels = np.zeros(rows, np.int32)
        labels[:len(members)] = self.labels[members]
        return ids, labels

    def real_rows(self, item):
        """How many rows of item `item` are examples (the rest: padding rows of evaluation on a mesh)."""
        step = self.first_step + item
        return len(self._batches_of_pass(step // self.batches_per_pass)[step % self.batches_per_pass][1])


# ----------------------------------------------------------------------------- training

class _IntervalMetrics(keras.callbacks.Callback):
    """Mean training loss and accuracy over one `fit` call, from the per-batch values (Keras logs
    running means; each batch's value is recovered from two consecutive means)."""

    def __init__(self):
        super().__init__()
        self.sums, self.count, self._previous = {}, 0, {}

    def on_train_batch_end(self, batch, logs=None):
        self.count += 1
        for name in ("loss", "accuracy"):
            mean = float(logs[name])
            value = mean * self.count - self._previous.get(name, 0.0) * (self.count - 1)
            self.sums[name] = self.sums.get(name, 0.0) + value
            self._previous[name] = mean

    def means(self):
        return {name: total / max(self.count, 1) for name, total in self.sums.items()}


class _Progress(keras.callbacks.Callback):
    """One line per `every` training steps when stdout is not a terminal (Keras' progress bar needs
    one, and its verbose=2 prints only at the end of a `fit`): global step, seconds per step, and the
    running loss and accuracy of this interval."""

    def __init__(self, first_step, total_steps, every):
        super().__init__()
        self.step, self.total_steps, self.every = first_step, total_steps, every
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        if self.step % self.every == 0:
            seconds = (time.perf_counter() - self._start) / (batch + 1)
            print(f"  step {self.step}/{self.total_steps}: {seconds:.2f} s/step, loss {float(logs['loss']):.4f}, "
                  f"accuracy {float(logs['accuracy']):.4f}", flush=True)


def process_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib():
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def plot_history(history, path, title):
    """Loss and accuracy vs training step: training means per evaluation interval and validation values.
    Returns the path, or None after a warning when matplotlib is missing or the plot cannot be written
    (a finished training run is never lost to its plot)."""
    try:
        _plot_history(history, path, title)
    except Exception as error:  # noqa: BLE001 -- any plotting failure: the metrics and model are already saved
        print(f"warning: no {path}: {type(error).__name__}: {error} (pip install matplotlib for the plot; "
              "metrics.json holds the same history)", file=sys.stderr, flush=True)
        return None
    return path


def _plot_history(history, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    for axis, metric in zip(axes, ("loss", "accuracy")):
        axis.plot(history["step"], history[f"train_{metric}"], "o-", label="train (mean since the last evaluation)")
        axis.plot(history["step"], history[f"val_{metric}"], "s-", label="validation")
        axis.set_xlabel("training step")
        axis.set_ylabel(metric)
        axis.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=2, frameon=False)  # below the plots, not on a curve
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _fingerprint(args, task, data_digest):
    return {"task": task, "data": data_digest, **{key: getattr(args, key, None) for key in _RESUME_KEYS}}


def _data_digest(*splits):
    digest = hashlib.sha256()
    for split in splits:
        digest.update(str(len(split)).encode())
        digest.update(split.labels.tobytes())
        for text in split.texts[:64]:
            digest.update(text.encode("utf-8"))
    return digest.hexdigest()[:16]


class _Checkpoint:
    """The training state in --checkpoint-dir: model.keras (weights, optimizer), rng_states.npz (the
    SeedGenerator states) and state.json (steps done, history, timings, and the options it was
    trained with)."""

    def __init__(self, directory, fingerprint):
        self.directory, self.fingerprint = directory, fingerprint

    @property
    def _state_path(self):
        return os.path.join(self.directory, "state.json")

    def load(self):
        """(model, state) of a saved run, or (None, None); SystemExit when it was trained otherwise."""
        if self.directory is None or not os.path.exists(self._state_path):
            return None, None
        with open(self._state_path, encoding="utf-8") as f:
            state = json.load(f)
        differences = [f"{key}: checkpoint {state['fingerprint'].get(key)!r}, now {value!r}"
                       for key, value in self.fingerprint.items() if state["fingerprint"].get(key) != value]
        if differences:
            sys.exit(f"error: --checkpoint-dir {self.directory} holds a run trained with other options "
                     f"({'; '.join(differences)}). Use another --checkpoint-dir, or the same options.")
        model = keras.saving.load_model(os.path.join(self.directory, "model.keras"))
        variables = self._rng_variables(model)
        with np.load(os.path.join(self.directory, "rng_states.npz")) as saved:
            states = [saved[f"state_{i}"] for i in range(len(saved.files))]
        if [s.shape for s in states] != [tuple(v.shape) for v in variables]:
            sys.exit(f"error: {self.directory}/rng_states.npz does not match the model's {len(variables)} "
                     "SeedGenerator states")
        for variable, value in zip(variables, states):  # in model order (their paths are global counters)
            variable.assign(value)
        return model, state

    @staticmethod
    def _rng_variables(model):
        """The states of the model's SeedGenerators (dropout masks, YOSO's training hash functions):
        `.keras` files do not restore them, so they are saved next to it."""
        return [variable for variable in model.variables if "seed_generator" in variable.path]

    def save(self, model, state):
        if self.directory is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        model.save(os.path.join(self.directory, "model.keras.tmp.keras"))
        os.replace(os.path.join(self.directory, "model.keras.tmp.keras"), os.path.join(self.directory, "model.keras"))
        rng = {f"state_{i}": keras.ops.convert_to_numpy(v) for i, v in enumerate(self._rng_variables(model))}
        np.savez(os.path.join(self.directory, "rng_states.tmp.npz"), **rng)
        os.replace(os.path.join(self.directory, "rng_states.tmp.npz"), os.path.join(self.directory, "rng_states.npz"))
        with open(self._state_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({**state, "fingerprint": self.fingerprint}, f, indent=1)
        os.replace(self._state_path + ".tmp", self._state_path)


@dataclasses.dataclass
class RunResult:
    metrics: dict
    classifier: keras.Model
    output_dir: str
    finished: bool


def train_and_export(task, args, tokenizer, class_names, train, validation, test):
    """Trains (resuming from --checkpoint-dir), evaluates on `test` once --steps are done, writes the
    outputs to `args.output_dir`; a RunResult (finished=False when --stop-after-steps stopped it).

    With --mesh, all of it (building or loading the model, training, evaluation, saving) runs
    under its `keras_yoso.distribution.SequenceParallel` (`mesh_distribution`); the returned
    classifier's variables stay on the mesh's devices (call it under that distribution, or load
    model.keras, which any process can use without one)."""
    distribution = mesh_distribution(args)
    if distribution is None:
        return _train_and_export(task, args, tokenizer, class_names, train, validation, test)
    with distribution.scope():
        return _train_and_export(task, args, tokenizer, class_names, train, validation, test)


def _batches(args, encoded, split, **kwargs):
    """Batches of one split, whose rows and lengths split evenly over --mesh."""
    return Batches(encoded, split.labels, args.batch_size, args.max_length, row_multiple=mesh_rows(args),
                   length_multiple=mesh_length_multiple(args), **kwargs)


def evaluate(classifier, batches):
    """(loss, accuracy) of `classifier` on `batches`: `model.evaluate`; with padding rows (evaluation
    on a --mesh whose data axis is > 1), from `model.predict` on the examples' rows only, with the
    loss of keras.losses.sparse_categorical_crossentropy (probabilities clipped to [1e-7, 1 - 1e-7])."""
    callbacks = [_OneStepInFlight()] if keras.distribution.distribution() is not None else []
    if batches.row_multiple == 1:
        loss, accuracy = classifier.evaluate(batches, verbose=0, callbacks=callbacks)
        return float(loss), float(accuracy)
    probabilities = classifier.predict(batches, verbose=0, callbacks=callbacks)
    rows, labels, offset = [], [], 0
    for item in range(len(batches)):
        batch_labels, real = batches[item][1], batches.real_rows(item)
        rows.append(offset + np.arange(real))
        labels.append(batch_labels[:real])
        offset += len(batch_labels)
    rows, labels = np.concatenate(rows), np.concatenate(labels)
    probabilities = probabilities[rows].astype(np.float32)
    probabilities = np.clip(probabilities / probabilities.sum(axis=-1, keepdims=True), 1e-7, 1.0 - 1e-7)
    loss = -np.log(probabilities[np.arange(len(labels)), labels]).astype(np.float64).mean()
    accuracy = (probabilities.argmax(axis=-1) == labels).mean()
    return float(loss), float(accuracy)


def _describe_mesh(args, probe, num_train):
    """Prints how --mesh splits the batches, and how many training examples a pass leaves out."""
    sizes = parse_mesh(args.mesh)
    mesh = keras.distribution.distribution().device_mesh
    platform = str(mesh.devices.flat[0]).split(":")[0]
    print(f"--mesh {args.mesh}: data and sequence parallel on {mesh.devices.size} {platform} devices "
          f"(keras_yoso.distribution.SequenceParallel, mesh axes {list(mesh.axis_names)} of shape {tuple(mesh.shape)}): "
          f"each device holds {args.batch_size // sizes['data']} row(s) x 1/{sizes['seq']} of each sequence "
          f"({args.max_length // sizes['seq']} of {args.max_length} positions at the longest)", flush=True)
    kept = sum(len(rows) for _, rows in probe._batches_of_pass(0))
    if kept < num_train:
        print(f"note: {num_train - kept} of {num_train} training examples per pass are left out (a bucket's last batch "
              f"is cut to a multiple of data={sizes['data']} rows; the shuffle of each pass picks which)", flush=True)


class _OneStepInFlight(keras.callbacks.Callback):
    """Waits for each evaluation or prediction step before Keras dispatches the next (training
    steps are waited for already: the progress callbacks read their loss). On a device mesh of
    virtual CPU devices, XLA:CPU's collectives deadlock when several steps of a model this size are
    in flight (observed with JAX 0.10.2, 8 devices on 2 cores: "Termination timeout for all
    reduce ... only 3 of them arrived", the process aborts)."""

    def on_test_batch_end(self, batch, logs=None):
        _wait(logs)

    def on_predict_batch_end(self, batch, logs=None):
        _wait(logs)


def _wait(logs):
    import jax

    jax.block_until_ready(logs)


def _train_and_export(task, args, tokenizer, class_names, train, validation, test):
    keras.utils.set_random_seed(args.seed)
    os.makedirs(args.output_dir, exist_ok=True)
    encoded = {name: tokenizer.encode(split.texts) for name, split in
               (("train", train), ("validation", validation), ("test", test))}
    probe = _batches(args, encoded["train"], train, seed=args.seed)
    args.steps = args.steps or probe.batches_per_pass * args.epochs
    args.warmup_steps = args.warmup_steps if args.warmup_steps is not None else round(args.warmup_fraction * args.steps)
    args.eval_every = args.eval_every or max(1, -(-args.steps // 10))
    checkpoint = _Checkpoint(args.checkpoint_dir, _fingerprint(args, task, _data_digest(train, validation, test)))

    classifier, state = checkpoint.load()
    if classifier is None:
        classifier = build_classifier(tokenizer.vocab_size, len(class_names), args)
        schedule = LinearWarmupLinearDecay(args.learning_rate, args.warmup_steps, args.steps)
        classifier.compile(optimizer=DenseGradientAdam(schedule), loss="sparse_categorical_crossentropy",
                           metrics=["accuracy"], jit_compile="auto")
        state = {"step": 0, "train_seconds": 0.0, "train_cpu_seconds": 0.0, "invocations": 0,
                 "history": {key: [] for key in ("step", "train_loss", "train_accuracy", "val_loss", "val_accuracy")}}
    state["invocations"] += 1
    validation_batches = _batches(args, encoded["validation"], validation)
    stop = args.steps if args.stop_after_steps is None else min(args.steps, state["step"] + args.stop_after_steps)
    print(f"{task}: {len(train)} train / {len(validation)} validation / {len(test)} test examples; "
          f"attention={args.attention}, {classifier.count_params():,} parameters, Keras backend "
          f"{keras.backend.backend()}, YOSO ops: {keras_yoso.ops.implementation_in_use()}; "
          f"steps {state['step']} -> {stop} of {args.steps} (batch {args.batch_size}, "
          f"{probe.batches_per_pass} per pass over the training split)", flush=True)
    if getattr(args, "mesh", None):
        _describe_mesh(args, probe, len(train))

    while state["step"] < stop:
        until = min(stop, (state["step"] // args.eval_every + 1) * args.eval_every)
        batches = _batches(args, encoded["train"], train, seed=args.seed, first_step=state["step"],
                           num_steps=until - state["step"])
        interval = _IntervalMetrics()
        start, start_cpu = time.perf_counter(), process_cpu_seconds()
        # shuffle=False: Keras would reorder the PyDataset batches with Python's random; Batches orders them.
        interactive = sys.stdout.isatty()
        callbacks = [interval] if interactive else [interval, _Progress(state["step"], args.steps, _progress_every(args))]
        classifier.fit(batches, epochs=1, shuffle=False, callbacks=callbacks, verbose=1 if interactive else 0)
        state["train_seconds"] += time.perf_counter() - start
        state["train_cpu_seconds"] += process_cpu_seconds() - start_cpu
        state["step"] = until
        if until % args.eval_every == 0 or until == args.steps:
            val_loss, val_accuracy = evaluate(classifier, validation_batches)
            means = interval.means()
            for key, value in (("step", until), ("train_loss", means["loss"]), ("train_accuracy", means["accuracy"]),
                               ("val_loss", val_loss), ("val_accuracy", val_accuracy)):
                state["history"][key].append(float(value))
            print(f"step {until}/{args.steps}: validation accuracy {val_accuracy:.4f}, loss {val_loss:.4f}", flush=True)
            checkpoint.save(classifier, state)
    if state["step"] < args.steps:
        checkpoint.save(classifier, state)
        print(f"stopped after step {state['step']} of {args.steps}; checkpoint in {args.checkpoint_dir}. Run the same "
              "command again to continue.", flush=True)
        return RunResult({}, classifier, args.output_dir, finished=False)
    checkpoint.save(classifier, state)
    return _finish(task, args, tokenizer, class_names, classifier, state, encoded, train, validation, test)


def _finish(task, args, tokenizer, class_names, classifier, state, encoded, train, validation, test):
    """Test evaluation, then the outputs, most valuable first: model.keras (every backend), the SavedModel
    (TensorFlow), metrics.json, and last history.png (a plot that cannot be drawn only warns)."""
    test_batches = _batches(args, encoded["test"], test)
    start, start_cpu = time.perf_counter(), process_cpu_seconds()
    test_loss, test_accuracy = evaluate(classifier, test_batches)
    test_seconds, test_cpu_seconds = time.perf_counter() - start, process_cpu_seconds() - start_cpu
    model_path = os.path.join(args.output_dir, "model.keras")
    classifier.save(model_path)
    export = _export(args, tokenizer, class_names, classifier)
    examples = args.steps * args.batch_size
    metrics = {
        "task": task,
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "validation_accuracy": state["history"]["val_accuracy"][-1],
        "validation_loss": state["history"]["val_loss"][-1],
        "steps": args.steps,
        "train_examples_per_second": examples / max(state["train_seconds"], 1e-9),
        "test_examples_per_second": len(test) / max(test_seconds, 1e-9),
        "train_seconds": state["train_seconds"],
        "train_cpu_seconds": state["train_cpu_seconds"],
        "test_seconds": test_seconds,
        "test_cpu_seconds": test_cpu_seconds,
        "invocations": state["invocations"],
        "peak_rss_mib": peak_rss_mib(),
        "num_train_examples": len(train),
        "num_validation_examples": len(validation),
        "num_test_examples": len(test),
        "num_parameters": int(classifier.count_params()),
        "keras_backend": keras.backend.backend(),
        "yoso_ops": keras_yoso.ops.implementation_in_use(),
        "mesh": _mesh_metrics(args),
        "model": model_path,
        "export": export,
        "class_names": list(class_names),
        "history": state["history"],
        "versions": {"keras": keras.__version__, "keras_yoso": keras_yoso.__version__,
                     keras.backend.backend(): _backend_version()},
        "command": [os.path.basename(sys.argv[0])] + sys.argv[1:],
        "args": vars(args),
    }
    with open(os.path.join(args.output_dir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    plot_history(state["history"], os.path.join(args.output_dir, "history.png"), f"{task}, attention={args.attention}, "
                 f"{keras.backend.backend()}")
    print(f"{task} attention={args.attention}: test accuracy {test_accuracy:.4f} (loss {test_loss:.4f}) on "
          f"{len(test)} examples | train {metrics['train_examples_per_second']:.1f} examples/s over "
          f"{state['train_seconds']:.0f} s, peak RSS {metrics['peak_rss_mib']:.0f} MiB | trained model: {model_path} "
          f"(keras.saving.load_model, any backend, after importing keras_yoso and this example's modules) | "
          f"{args.output_dir}", flush=True)
    return RunResult(metrics, classifier, args.output_dir, finished=True)


def _mesh_metrics(args):
    """metrics.json's "mesh": None on one device, else the axes and the devices of --mesh."""
    if not getattr(args, "mesh", None):
        return None
    mesh = keras.distribution.distribution().device_mesh
    return {**parse_mesh(args.mesh), "axis_names": list(mesh.axis_names),
            "devices": [str(device) for device in mesh.devices.flat]}


def _backend_version():
    name = keras.backend.backend()
    module = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}.get(name)
    return getattr(__import__(module), "__version__", "?") if module else "?"


def _export(args, tokenizer, class_names, classifier):
    """Exports the raw-string SavedModel (TensorFlow backend); a note of what was (not) written."""
    if args.export == "none":
        return "none (--export none)"
    if keras.backend.backend() != "tensorflow":
        print(f"note: no saved_model/ written: a SavedModel of raw strings needs the TensorFlow backend "
              f"(this run used {keras.backend.backend()}); the trained classifier is in "
              f"{os.path.join(args.output_dir, 'model.keras')}", flush=True)
        return f"none (Keras backend {keras.backend.backend()})"
    import text_serving

    export_dir = os.path.join(args.output_dir, "saved_model")
    text_serving.export(classifier, tokenizer.serving_config(), class_names, export_dir,
                        portable=args.export == "portable")
    return f"{args.export}: {export_dir}"
