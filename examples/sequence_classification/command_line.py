"""The command line of the LRA classifier: the model, training and run options, their checks, and
--preset lra (YOSO's appendix Table 4)."""

import os

import keras

from .device_mesh import check_mesh_arguments

ATTENTIONS = ("yoso", "yoso_e", "linear_relative", "softmax", "none")


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
    add_training_arguments(parser, lra_preset=lra_preset)


def add_training_arguments(parser, *, lra_preset=None, batch_size=32, learning_rate=1e-4, export=True):
    """Adds the training and run options of training.train_and_export (with --preset lra when
    `lra_preset` is given; --export when `export`, else no SavedModel is written)."""
    train = parser.add_argument_group("training")
    if lra_preset is not None:
        train.add_argument("--preset", choices=("lra",), default=None,
                           help="lra: the paper's LRA training of this task, appendix Table 4: "
                                + ", ".join(f"{key.replace('_', '-')} {value}" for key, value in lra_preset.items())
                                + ". Explicit options still win.")
    train.add_argument("--steps", type=int, default=None,
                       help="optimizer steps in all (batches). Default: --epochs passes over the training split")
    train.add_argument("--epochs", type=int, default=1, help="passes over the training split when --steps is not "
                                                             "given. Default: %(default)s")
    train.add_argument("--batch-size", type=int, default=batch_size,
                       help="Default: %(default)s (the LRA value of Table 4 is 32: --preset lra)")
    train.add_argument("--learning-rate", type=float, default=learning_rate,
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
    if export:
        run.add_argument("--export", choices=("portable", "custom_op", "none"), default="portable",
                         help="TensorFlow backend: the SavedModel of raw strings. portable: YOSO runs on the composite "
                              "in the graph, so it serves with TensorFlow and tensorflow-text alone (no keras_yoso); "
                              "custom_op: the C++ kernels, faster, and the serving process must `import keras_yoso` "
                              "before loading (docs/benchmarks.md measures both). Default: %(default)s")
    else:
        parser.set_defaults(export="none")
    run.add_argument("--verbose", action="store_true", help="keep TensorFlow's C++ start-up logs")


def default_output_dir(task, attention):
    """runs/<task>-<attention>-<backend>: runs of different backends never overwrite each other."""
    return os.path.join("runs", f"{task}-{attention}-{keras.backend.backend()}")


def check_positive_arguments(parser, args, names):
    """parser.error() naming the first of the options `names` (attribute names) below 1; None passes."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def check_model_arguments(parser, args):
    """parser.error() naming the first option with an invalid value."""
    check_positive_arguments(parser, args, ("num_hashes", "hash_code_len", "num_layers", "hidden_dim", "ffn_dim",
                                            "num_heads", "max_length"))
    check_training_arguments(parser, args)
    check_positive_arguments(parser, args, ("conv_window",))
    if args.conv_window is not None and args.attention != "yoso":
        parser.error(f"--conv-window (YOSO-C) needs --attention yoso, got --attention {args.attention}")
    if args.hidden_dim % args.num_heads:
        parser.error(f"--hidden-dim {args.hidden_dim} must be a multiple of --num-heads {args.num_heads}")
    if not 0.0 <= args.dropout < 1.0:
        parser.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if args.embedding_scale <= 0:
        parser.error(f"--embedding-scale must be > 0, got {args.embedding_scale}")


def check_training_arguments(parser, args):
    """parser.error() naming the first training or run option with an invalid value."""
    check_positive_arguments(parser, args, ("epochs", "batch_size", "steps", "eval_every", "stop_after_steps"))
    for name in ("validation_fraction", "warmup_fraction"):
        if not 0.0 <= getattr(args, name) < 1.0:
            parser.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
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
