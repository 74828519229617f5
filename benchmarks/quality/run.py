"""Model-quality benchmark: the same model and training budget for every attention, only the attention changes.

    python benchmarks/quality/run.py --task mqar --attention softmax yoso linear --length 256 --pairs 16 \\
        --steps 1000 --batch-size 64 --lr 1e-3 3e-3 --seeds 0 1 2
    python benchmarks/quality/run.py --task mqar --attention yoso --attention-kwargs '{"num_hashes": 16}' --name m16
    python benchmarks/quality/run.py --task imdb --attention yoso softmax linformer --steps 500
    python benchmarks/quality/run.py --plot-only runs/quality/mqar/results.json      # figures only

For every attention, learning rate and seed it trains a fresh model (models.py), evaluates it on the
task's fixed test set, prints one table row, and appends one record to <out>/results.json (a JSON list:
every argument, the metrics, Keras backend, date, machine). At the end it prints the best learning rate
of each attention (highest mean test accuracy over seeds; lowest bits per byte for lm -- chosen on the
test set, as Zoology reports the best of its learning-rate sweep: a quick look, not a published table)
and draws <out>/<task>.png from all the records in <out>/results.json (plot.py). Published tables follow
the protocol instead: protocol.py drives this harness, chooses each rate on the validation split and
runs 3 seeds at it.

Tasks (tasks.py): mqar (multi-query associative recall, Zoology), listops, tags, imdb (bidirectional
classification, LRA classifier), lm (byte-level causal LM on IMDB text, bits per byte).
Attentions (attentions.py): yoso yoso_c yoso_star yoso_e linear_relative linear_relative_nohorizon
softmax linear performer reformer sliding_window linformer gated_deltanet, and none (no attention: the floor).

Training: Adam (no weight decay), learning rate warming up linearly over --warmup-fraction of the steps
from 0 to --lr, then cosine decay to 0 (keras.optimizers.schedules.CosineDecay). One `train_on_batch` per
step, compiled with XLA where every layer allows it (jit_compile="auto": YosoAttention with the native
kernels does on JAX). mqar draws a fresh batch every step from a NumPy generator seeded by --seed; its
test set (--test-size sequences) is drawn from a separate fixed seed, and its validation set
(--validation-size sequences, default as many) from a third, without any test sequence; no training
batch holds a validation or test sequence (tasks.mqar_batch_excluding: a batch without one is drawn
exactly as before). The classification and lm data are fixed (tasks.py); listops, tags and imdb have a
validation split of --validation-size examples (default 0) that holds no training or test example
(tasks.load_classification); lm's validation split is --validation-size windows (default 0) of training
reviews that no training window reads (tasks.lm_data). --seed changes weights, batch order and hashing.

Measurements: accuracy and loss on the test set, and on the validation set where there is one
("validation_accuracy", "validation_loss"; mqar: at the query positions only; lm: next-byte
accuracy, loss in nats and bits per byte = loss / ln 2, "validation_bits_per_byte"); seconds per step: the median wall time of the
training steps after the first 3 and after the first step of each new input shape (those compile);
peak RSS: the process's peak resident memory during the run (Linux: reset before each run by writing 5
to /proc/self/clear_refs, then read from getrusage's ru_maxrss; where the reset fails, the peak since
the process started, said by "rss_scope"); state bytes per layer: attentions.state_bytes, the causal
decoding state of one layer for one sequence in float32.

Failed runs (issue 43, the protocol): before the attentions, the harness trains the model with no
attention (attentions.NO_ATTENTION, "none": the attention branch returns zeros) on the same task, steps,
learning rate and seed -- or reuses such a record of <out>/results.json -- and judges every run
against it (`judge`): "diverged" when a training loss is not finite (the run is stopped at that step),
"learned_nothing" when its test score does not beat the floor's by `floor_margin` (accuracy; bits per
byte for lm), else "ok". Each record says so in "status" and why in "failure"; a failed run is printed
as FAILED and left out of the best-learning-rate summary. --no-floor skips the floor ("unjudged").

KERAS_BACKEND defaults to jax here (set it to run another backend).
"""

import argparse
import copy
import datetime
import json
import math
import os
import platform
import resource
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
sys.path[:0] = [HERE, os.path.abspath(EXAMPLES)]
if __name__ == "__main__":  # only as a script: an importer (the tests) keeps its own backend and its children's
    os.environ.setdefault("KERAS_BACKEND", "jax")

import plot  # noqa: E402  (no Keras: --plot-only stays fast)

TASKS = ("mqar", "listops", "tags", "imdb", "lm")
CAUSAL_TASKS = ("mqar", "lm")
# Per-task defaults of the options left out on the command line. Two learning rates each (the protocol's
# minimum), where docs/quality.md found each attention's best: on mqar (256, 16) and tags softmax's best was
# the lower one and YOSO's the higher one or the reverse; at 1e-3 alone YOSO stayed at chance on tags.
CLASSIFICATION_LR = [3e-3, 1e-2]
TASK_DEFAULTS = {
    "mqar": dict(length=256, steps=1000, batch_size=64, train_size=None, test_size=1000, validation_size=None,
                 dropout=0.0, lr=[3e-3, 1e-2]),
    "listops": dict(length=1000, steps=500, batch_size=32, train_size=10000, test_size=1000, validation_size=0,
                    dropout=0.1, lr=CLASSIFICATION_LR),
    "tags": dict(length=512, steps=500, batch_size=32, train_size=4000, test_size=1000, validation_size=0,
                 dropout=0.1, lr=CLASSIFICATION_LR),
    "imdb": dict(length=2048, steps=500, batch_size=32, train_size=25000, test_size=1000, validation_size=0,
                 dropout=0.1, lr=CLASSIFICATION_LR),
    "lm": dict(length=1024, steps=500, batch_size=8, train_size=None, test_size=64, validation_size=0, dropout=0.0,
               lr=[1e-3, 3e-3]),
}
MQAR_TEST_SEED = 12345  # the mqar test set is the same for every training seed
MQAR_VALIDATION_SEED = 67890  # so is its validation set (its own stream; never a test sequence)
VALIDATION_TASKS = ("mqar", "listops", "tags", "imdb", "lm")  # the tasks with a validation split (--validation-size)
UNTIMED_STEPS = 3


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=TASKS, default="mqar", help="Default: %(default)s")
    parser.add_argument("--attention", nargs="+", default=["yoso"], metavar="NAME",
                        help="one or more registered attentions (attentions.py), each trained on the same budget")
    parser.add_argument("--attention-kwargs", default="{}", metavar="JSON",
                        help='keyword arguments of the attentions, e.g. \'{"num_hashes": 32, "hash_code_len": 8}\': '
                             "each key goes to the attentions that take it (and must be taken by one), or "
                             '\'{"yoso": {...}, "performer": {...}}\' per attention')
    parser.add_argument("--name", default=None,
                        help="label of these runs in tables and plots (with several attentions: '<attention> "
                             "<name>'). Default: the attention and its non-default keyword arguments")
    model = parser.add_argument_group("data and model")
    model.add_argument("--length", type=int, default=None,
                       help="sequence length (classification: most tokens kept). Default: mqar 256, listops 1000, "
                            "tags 512, imdb 2048, lm 1024")
    model.add_argument("--pairs", type=int, default=16, help="mqar key-value pairs. Default: %(default)s")
    model.add_argument("--vocab", type=int, default=8192, help="mqar vocabulary. Default: %(default)s")
    model.add_argument("--width", type=int, default=64, help="model width d. Default: %(default)s")
    model.add_argument("--layers", type=int, default=2, help="blocks. Default: %(default)s")
    model.add_argument("--heads", type=int, default=2, help="attention heads, key_dim = width / heads. "
                                                            "Default: %(default)s")
    model.add_argument("--short-conv", choices=("residual", "attention_input"), default="residual",
                       help="mqar/lm blocks: the short convolution as its own residual branch, x += Conv(LN x); "
                            "x += Attn(LN x) (residual), or inside the attention branch, x += Attn(Conv(LN x)) "
                            "(attention_input). Default: %(default)s (models.CausalBlock says why)")
    model.add_argument("--ffn-dim", type=int, default=None,
                       help="classification: feed-forward and classifier hidden width. Default: 2 * width")
    model.add_argument("--dropout", type=float, default=None,
                       help="classification dropout (Table 4: 0.1). Default: 0.1 classification, 0 mqar/lm")
    model.add_argument("--train-size", type=int, default=None,
                       help="training examples (listops 10000, tags 4000, imdb 25000; mqar/lm sample fresh)")
    model.add_argument("--test-size", type=int, default=None,
                       help="test examples: mqar 1000 sequences, listops/tags/imdb 1000, lm 64 windows")
    model.add_argument("--validation-size", type=int, default=None,
                       help="validation examples, each run scored on them too, never a test or training example "
                            "(mqar, listops, tags: their own seed stream; imdb: training reviews left out of "
                            "--train-size; lm: windows of training reviews held out of the training bytes; "
                            "0: none). Default: mqar --test-size, else 0")
    train = parser.add_argument_group("training")
    train.add_argument("--steps", type=int, default=None, help="Default: mqar 1000, lm and classification 500")
    train.add_argument("--batch-size", type=int, default=None, help="Default: mqar 64, classification 32, lm 8")
    train.add_argument("--lr", type=float, nargs="+", default=None,
                       help="peak learning rates (each trained). "
                            "Default: mqar and classification 3e-3 1e-2, lm 1e-3 3e-3")
    train.add_argument("--seeds", type=int, nargs="+", default=[0], help="Default: 0")
    train.add_argument("--warmup-fraction", type=float, default=0.1, help="Default: %(default)s")
    train.add_argument("--eval-batch-size", type=int, default=None, help="Default: --batch-size")
    train.add_argument("--log-every", type=int, default=None, help="steps between progress lines. Default: steps/10")
    train.add_argument("--no-jit", action="store_true", help="run eagerly (debugging)")
    train.add_argument("--no-floor", action="store_true",
                       help="do not train the model with no attention, nor judge the runs against it")
    out = parser.add_argument_group("outputs")
    out.add_argument("--out", default=None, help="folder of results.json and the PNG. Default: runs/quality/<task>")
    out.add_argument("--plot-only", nargs="*", default=None, metavar="RESULTS_JSON",
                     help="train nothing: draw the figures of these results.json files (default: <out>/results.json)")
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    for key, value in TASK_DEFAULTS[args.task].items():
        if getattr(args, key) is None:
            setattr(args, key, copy.copy(value))  # a list default is shared between tasks
    if args.validation_size is None:
        args.validation_size = args.test_size
    if args.validation_size < 0:
        parser.error(f"--validation-size must be >= 0, got {args.validation_size}")
    if args.validation_size and args.task not in VALIDATION_TASKS:
        parser.error(f"--validation-size: --task {args.task} has no validation split yet (only "
                     f"{', '.join(VALIDATION_TASKS)}), got {args.validation_size}")
    args.ffn_dim = args.ffn_dim or 2 * args.width
    args.eval_batch_size = args.eval_batch_size or args.batch_size
    args.log_every = args.log_every or max(1, args.steps // 10)
    args.out = args.out or os.path.join("runs", "quality", args.task)
    for name in ("length", "pairs", "vocab", "width", "layers", "heads", "steps", "batch_size", "test_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.width % args.heads:
        parser.error(f"--width {args.width} must be a multiple of --heads {args.heads}")
    if args.task == "mqar" and (3 * args.pairs > args.length or 2 * args.pairs > args.vocab):
        parser.error(f"mqar needs 3 * pairs <= length and 2 * pairs <= vocab, got pairs={args.pairs}, "
                     f"length={args.length}, vocab={args.vocab}")
    try:
        args.attention_kwargs = json.loads(args.attention_kwargs)
    except json.JSONDecodeError as error:
        parser.error(f"--attention-kwargs is not JSON: {error}")
    if not isinstance(args.attention_kwargs, dict):
        parser.error("--attention-kwargs must be a JSON object")
    return parser, args


def kwargs_per_attention(parser, args):
    """{attention: its full keyword arguments}; parser.error() on unknown names, modes or keys."""
    import attentions

    causal = args.task in CAUSAL_TASKS
    raw = args.attention_kwargs
    per_attention = bool(raw) and all(key in attentions.ATTENTIONS for key in raw)
    result = {}
    for name in args.attention:
        spec = attentions.ATTENTIONS.get(name)
        if spec is None:
            parser.error(f"unknown --attention {name!r}; choose from {', '.join(attentions.ATTENTIONS)}")
        if causal and not spec.causal:
            parser.error(f"--attention {name} is bidirectional only; --task {args.task} is causal")
        if not causal and not spec.bidirectional:
            parser.error(f"--attention {name} is causal only; --task {args.task} is bidirectional classification")
        given = raw.get(name, {}) if per_attention else raw
        if per_attention:
            unknown = set(given) - set(spec.defaults)
            if unknown:
                parser.error(f"--attention-kwargs for {name}: it takes {sorted(spec.defaults)}, not {sorted(unknown)}")
        result[name] = attentions.resolve_kwargs(name, given)
    if not per_attention:
        taken = set().union(*(attentions.ATTENTIONS[n].defaults for n in args.attention))
        unknown = set(raw) - taken
        if unknown:
            parser.error(f"--attention-kwargs keys {sorted(unknown)} are taken by none of {args.attention}")
    return result


# ----------------------------------------------------------------------------- measurements

def reset_peak_rss():
    """Resets the kernel's peak-RSS counter of this process (Linux); True when it worked."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def machine():
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu_model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return {"processor": platform.processor(), "cpu_model": cpu_model, "cpu_count": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version()}


def median_step_seconds(times, shapes):
    """Median of the step times after the first UNTIMED_STEPS, leaving out each shape's first step."""
    seen, kept = set(), []
    for step, (seconds, shape) in enumerate(zip(times, shapes)):
        if step >= UNTIMED_STEPS and shape in seen:
            kept.append(seconds)
        seen.add(shape)
    return statistics.median(kept) if kept else statistics.median(times)


def label_of(args, name, kwargs):
    import attentions

    if args.name:
        return args.name if len(args.attention) == 1 else f"{name} {args.name}"
    changed = {k: v for k, v in kwargs.items() if attentions.ATTENTIONS[name].defaults.get(k) != v}
    return name + ("(" + ",".join(f"{k}={v}" for k, v in changed.items()) + ")" if changed else "")


SHORT_NAMES = {"num_hashes": "m", "hash_code_len": "tau", "conv_window": "conv", "backward": "bwd",
               "hash_method": "hash", "use_expectation": "E", "num_features": "F", "chunk_size": "C",
               "num_buckets": "buckets", "conv_kernel": "conv", "horizon": "horizon", "window": "w",
               "feature_dim": "Fqk"}


def settings_of(name, kwargs):
    """The attention's keyword arguments, short: None, False, YOSO's default backward and hash method and
    the chunk size of linear / performer (it does not change their results) left out."""
    import attentions

    quiet = {"backward": "lower_bound", "hash_method": attentions.YOSO_DEFAULTS["hash_method"]}
    if name in ("linear", "performer"):
        quiet["chunk_size"] = kwargs.get("chunk_size")
    return ",".join(f"{SHORT_NAMES.get(k, k)}={v}" for k, v in kwargs.items()
                    if v is not None and v is not False and quiet.get(k, object()) != v) or "-"


# ----------------------------------------------------------------------------- one run

def warmup_steps(args):
    return min(args.steps - 1, max(1, round(args.warmup_fraction * args.steps))) if args.steps > 1 else 0


def has_validation(args):
    """Whether runs of `args` are scored on a validation split too (VALIDATION_TASKS, --validation-size > 0)."""
    return args.task in VALIDATION_TASKS and bool(args.validation_size)


def cell_fields(args, lr, seed):
    """The fields of a record that define its experiment but for the attention: runs with the same ones
    are judged against the same model with no attention."""
    import keras

    causal = args.task in CAUSAL_TASKS
    return {"task": args.task, "length": args.length, "pairs": args.pairs if args.task == "mqar" else None,
            "vocab": args.vocab if args.task == "mqar" else None, "width": args.width, "layers": args.layers,
            "heads": args.heads, "ffn_dim": None if causal else args.ffn_dim,
            "short_conv": args.short_conv if causal else None, "dropout": args.dropout, "steps": args.steps,
            "batch_size": args.batch_size, "warmup_steps": warmup_steps(args), "train_size": args.train_size,
            "test_size": args.test_size, "lr": lr, "seed": seed, "keras_backend": keras.backend.backend()}


def compile_model(model, args, lr):
    import keras
    from sequence_classification.optimizer import DenseGradientAdam  # Adam with dense gradients on every backend

    warmup = warmup_steps(args)
    if warmup:
        schedule = keras.optimizers.schedules.CosineDecay(0.0, args.steps - warmup, warmup_target=lr,
                                                          warmup_steps=warmup)
    else:
        schedule = lr
    model.compile(optimizer=DenseGradientAdam(schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=False if args.no_jit else "auto")
    return warmup


def task_setup(args, name, kwargs, seed):
    """(model, batch(step) -> (x, y), evaluate(split) -> dict, data description) of --task; split is "test",
    or "validation" where the task has a validation split (VALIDATION_TASKS, args.validation_size > 0)."""
    import numpy as np

    import models
    import tasks

    if args.task == "mqar":
        model = models.build_causal_model(args, name, kwargs, args.vocab, args.length, args.pairs)
        rng = np.random.default_rng(seed)
        shape = (args.length, args.pairs, args.vocab)
        test = tasks.mqar_batch(np.random.default_rng(MQAR_TEST_SEED), args.test_size, *shape)
        held_out = tasks.sequence_set(test[0])
        validation = None
        if args.validation_size:
            validation = tasks.mqar_batch_excluding(np.random.default_rng(MQAR_VALIDATION_SEED), args.validation_size,
                                                    *shape, excluded=held_out)
            held_out |= tasks.sequence_set(validation[0])

        def batch(step):
            t, p, y = tasks.mqar_batch_excluding(rng, args.batch_size, *shape, excluded=held_out)
            return [t, p], y

        def evaluate(split):
            tokens, positions, targets = test if split == "test" else validation
            return model.evaluate([tokens, positions], targets, batch_size=args.eval_batch_size, verbose=0,
                                  return_dict=True)

        return model, batch, evaluate, (f"MQAR, vocab {args.vocab}, fresh batches (never a held-out sequence), "
                                        f"{args.validation_size or 0} validation and {args.test_size} test sequences")
    if args.task == "lm":
        train, validation, test = tasks.lm_data(bool(args.validation_size))
        model = models.build_causal_model(args, name, kwargs, 256, args.length, None)
        rng = np.random.default_rng(seed)
        held_out = {"test": tasks.lm_test_set(test, args.test_size, args.length)}
        if args.validation_size:
            held_out["validation"] = tasks.lm_test_set(validation, args.validation_size, args.length)

        def batch(step):
            return tasks.lm_batch(rng, train, args.batch_size, args.length)

        def evaluate(split):
            logs = model.evaluate(*held_out[split], batch_size=args.eval_batch_size, verbose=0, return_dict=True)
            return {**logs, "bits_per_byte": logs["loss"] / math.log(2)}

        held = (f", {args.validation_size} windows of held-out training reviews ({len(validation):,} bytes) for "
                "validation" if args.validation_size else "")
        return model, batch, evaluate, (f"IMDB bytes: random train windows, {args.test_size} test-split windows "
                                        f"({len(train):,} / {len(test):,} bytes){held}")
    from sequence_classification.batches import Batches

    data = tasks.load_classification(args.task, args.length, args.train_size, args.test_size, args.validation_size)
    model = models.build_classifier(args, name, kwargs, data.vocab_size, data.num_classes, args.length)
    train = Batches(data.train_ids, data.train_labels, args.batch_size, args.length, seed=seed, num_steps=args.steps)
    held_out = {"test": Batches(data.test_ids, data.test_labels, args.eval_batch_size, args.length)}
    if args.validation_size:
        held_out["validation"] = Batches(data.validation_ids, data.validation_labels, args.eval_batch_size,
                                         args.length)

    def evaluate(split):
        return model.evaluate(held_out[split], verbose=0, return_dict=True)

    return model, train.__getitem__, evaluate, (f"{data.description}: {len(data.train_ids)} train / "
                                                f"{len(data.test_ids)} test")


def run_one(args, name, kwargs, lr, seed, label, command):
    """Trains and evaluates one model; its record (`command`: the command line, for the record)."""
    import keras
    import numpy as np

    import attentions
    import keras_yoso

    keras.utils.clear_session()
    rss_scope = "run" if reset_peak_rss() else "process"
    keras.utils.set_random_seed(seed)
    run_args = copy.copy(args)
    run_args.seed = seed
    model, batch, evaluate, data_description = task_setup(run_args, name, kwargs, seed)
    compile_model(model, run_args, lr)
    times, shapes, history, interval = [], [], [], []
    diverged = None
    tag = f"[{label} lr={lr:g} seed={seed}]"
    start = time.perf_counter()
    for step in range(args.steps):
        x, y = batch(step)
        begin = time.perf_counter()
        logs = model.train_on_batch(x, y, return_dict=True)
        times.append(time.perf_counter() - begin)
        shapes.append(tuple(np.shape(x[0] if isinstance(x, list) else x)))
        interval.append((logs["loss"], logs["accuracy"]))
        if not math.isfinite(logs["loss"]):
            print(f"  {tag} step {step + 1}: loss is {logs['loss']}, stopping this run", flush=True)
            diverged = {"step": step + 1, "train_loss": float(logs["loss"])}
            break
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            loss, accuracy = (statistics.mean(v) for v in zip(*interval))
            history.append({"step": step + 1, "train_loss": loss, "train_accuracy": accuracy})
            print(f"  {tag} step {step + 1}/{args.steps}: train loss {loss:.4f}, accuracy {accuracy:.4f}, "
                  f"{median_step_seconds(times, shapes):.3f} s/step", flush=True)
            interval = []
    train_seconds = time.perf_counter() - start
    begin = time.perf_counter()
    metrics = evaluate("test")
    validation = evaluate("validation") if has_validation(args) else None
    eval_seconds = time.perf_counter() - begin
    key_dim = args.width // args.heads
    backend = keras.backend.backend()
    record = {
        **cell_fields(args, lr, seed), "label": label, "attention": name, "attention_kwargs": kwargs,
        "settings": settings_of(name, kwargs),
        "accuracy": float(metrics["accuracy"]), "loss": float(metrics["loss"]),
        "seconds_per_step": median_step_seconds(times, shapes), "peak_rss_mib": peak_rss_mib(), "rss_scope": rss_scope,
        "state_bytes_per_layer": attentions.state_bytes(name, args.heads, key_dim, args.length, **kwargs),
        "key_dim": key_dim, "steps_done": len(times), "schedule": "linear warmup from 0, cosine decay to 0",
        "optimizer": "Adam", "data": data_description,
        "train_seconds": train_seconds, "eval_seconds": eval_seconds, "num_parameters": int(model.count_params()),
        "jit_compile": bool(model.jit_compile),
        "backend_version": getattr(__import__({"jax": "jax", "torch": "torch"}.get(backend, "tensorflow")),
                                   "__version__", "?"),
        "keras_version": keras.__version__, "keras_yoso_version": keras_yoso.__version__,
        "yoso_ops": keras_yoso.ops.implementation_in_use(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
        "command": command,
        "args": {k: v for k, v in vars(args).items()}, "history": history, "diverged": diverged,
    }
    if "bits_per_byte" in metrics:
        record["bits_per_byte"] = float(metrics["bits_per_byte"])
    record["validation_size"] = args.validation_size if validation is not None else None
    record["validation_accuracy"] = None if validation is None else float(validation["accuracy"])
    record["validation_loss"] = None if validation is None else float(validation["loss"])
    if validation is not None and "bits_per_byte" in validation:
        record["validation_bits_per_byte"] = float(validation["bits_per_byte"])
    return record


# ----------------------------------------------------------------------------- failed runs

FLOOR_MARGIN = 0.01  # the least improvement over the floor that counts: accuracy, or bits per byte (lm)


def scored_predictions(record):
    """How many test predictions an accuracy averages (MQAR: every query of every test sequence)."""
    return record["test_size"] * (record["pairs"] if record["task"] == "mqar" else 1)


def floor_margin(floor):
    """How much a run's score must exceed the floor's: FLOOR_MARGIN, or for an accuracy two standard
    errors of the floor's accuracy over the test predictions when that is larger (a model no better than
    the floor exceeds it by that only 2.3% of the time)."""
    if floor["task"] == "lm":
        return FLOOR_MARGIN
    p = floor["accuracy"]
    return max(FLOOR_MARGIN, 2.0 * math.sqrt(p * (1.0 - p) / scored_predictions(floor)))


def judge(record, floor, split="test", floor_is="same task, steps, rate and seed"):
    """(status, failure): ("diverged", why) when a loss was not finite; ("learned_nothing", why) when the
    run's score on `split` ("test", or "validation": its validation score) -- accuracy; lm: bits per
    byte -- does not beat the model with no attention, `floor` (a record; `floor_is` says which one, for the
    message), on the same split by floor_margin; ("ok", None) otherwise; ("unjudged", None) without a floor."""
    if split not in ("test", "validation"):
        raise ValueError(f"judge: split must be 'test' or 'validation', got {split!r}")
    if record.get("diverged") or not math.isfinite(record["loss"]):
        step = (record.get("diverged") or {}).get("step", record["steps_done"])
        return "diverged", (f"the loss was not finite at step {step} of {record['steps']}: the run was stopped "
                            f"there (test loss {record['loss']})")
    if floor is None:
        return "unjudged", None
    test_field, validation_field, _, _ = plot.metric(record["task"])
    field = test_field if split == "test" else validation_field
    if record["task"] == "lm":
        margin = floor_margin(floor)
        if record[field] > floor[field] - margin:
            return "learned_nothing", (f"{split} bits per byte {record[field]:.4f} is not below the model with no "
                                       f"attention ({floor[field]:.4f}, {floor_is}) by {margin:g}")
        return "ok", None
    if split == "validation":
        margin = floor_margin({**floor, "accuracy": floor[field], "test_size": floor["validation_size"]})
    else:
        margin = floor_margin(floor)
    if record[field] < floor[field] + margin:
        return "learned_nothing", (f"{split} accuracy {record[field]:.4f} does not beat the model with no "
                                   f"attention ({floor[field]:.4f}, {floor_is}) by {margin:.4f}")
    return "ok", None


def find_floor(records, cell):
    """The last record of the model with no attention in `records` whose experiment is `cell`
    (cell_fields), or None."""
    import attentions

    matches = [r for r in records if r.get("attention") == attentions.NO_ATTENTION
               and all(r.get(key) == value for key, value in cell.items())]
    return matches[-1] if matches else None


def append_results(path, records):
    """Appends `records` to the JSON list in `path` (created when missing), atomically."""
    existing = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            existing = json.load(f)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(existing + list(records), f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    return existing + list(records)


COLUMNS = (("attention", 24, "s"), ("settings", 44, "s"), ("lr", 8, "g"), ("seed", 4, "d"), ("accuracy", 8, ".4f"),
           ("loss", 8, ".4f"), ("s/step", 8, ".4f"), ("RSS MiB", 8, ".0f"), ("state B/layer", 13, "s"))


def table_row(values):
    cells = []
    for (name, width, fmt), value in zip(COLUMNS, values):
        text = value if isinstance(value, str) else format(value, fmt)
        cells.append(text[:width].ljust(width) if fmt == "s" else text.rjust(width))
    return " ".join(cells)


def main(argv=None):
    parser, args = parse_args(argv)
    results_path = os.path.join(args.out, "results.json")
    if args.plot_only is not None:
        paths = args.plot_only or [results_path]
        records = plot.load(paths)
        for line in plot.summary_lines(records):
            print(line)
        out = args.out if any(a == "--out" or a.startswith("--out=") for a in (argv or sys.argv[1:])) \
            else os.path.dirname(os.path.abspath(paths[0]))
        for task in sorted({r["task"] for r in records}):
            print(f"wrote {plot.plot_task(records, task, out)}")
        return records
    kwargs = kwargs_per_attention(parser, args)
    import attentions

    for name, why in attentions.unavailable(args.attention).items():  # before any run, the floor included
        parser.error(f"--attention {name} {why}")
    command = ["benchmarks/quality/run.py"] + list(sys.argv[1:] if argv is None else argv)
    import keras

    print(f"task {args.task}: length {args.length}" + (f", {args.pairs} pairs, vocab {args.vocab}"
                                                         if args.task == "mqar" else "") +
          f"; width {args.width}, {args.layers} layers, {args.heads} heads; {args.steps} steps of batch "
          f"{args.batch_size}; lr {args.lr}; seeds {args.seeds}; Keras backend {keras.backend.backend()}", flush=True)
    header = table_row([name for name, _, _ in COLUMNS])
    rows, records = [], []
    existing = [] if args.no_floor or not os.path.exists(results_path) else plot.load([results_path])

    def train(name, lr, seed, floor):
        import attentions

        label = label_of(args, name, kwargs[name]) if name in kwargs else name
        record = run_one(args, name, kwargs.get(name, {}), lr, seed, label, command)
        if name == attentions.NO_ATTENTION:
            record["status"], record["failure"] = "floor", None
        else:
            record["status"], record["failure"] = judge(record, floor)
        record["floor"] = None if floor is None else {key: floor.get(key) for key in ("accuracy", "loss", "bits_per_byte",
                                                                                      "date")}
        append_results(results_path, [record])
        records.append(record)
        state = record["state_bytes_per_layer"]
        rows.append(table_row([label, settings_of(name, kwargs.get(name, {})), lr, seed, record["accuracy"],
                               record.get("bits_per_byte", record["loss"]), record["seconds_per_step"],
                               record["peak_rss_mib"], f"{state:,}" if state is not None else "-"]))
        print("\n".join([header, rows[-1]]), flush=True)
        if record["failure"]:
            print(f"  FAILED ({record['status']}): {record['failure']}", flush=True)
        return record

    import attentions

    floors = {}
    if not args.no_floor:
        for lr in args.lr:
            for seed in args.seeds:
                floors[lr, seed] = find_floor(existing, cell_fields(args, lr, seed))
                if floors[lr, seed] is None:
                    print(f"the model with no attention (the floor every run must beat), lr={lr:g} seed={seed}:",
                          flush=True)
                    floors[lr, seed] = train(attentions.NO_ATTENTION, lr, seed, None)
                else:
                    print(f"the model with no attention, lr={lr:g} seed={seed}: reusing its record of "
                          f"{floors[lr, seed].get('date')} in {results_path} (accuracy "
                          f"{floors[lr, seed]['accuracy']:.4f})", flush=True)
    for name in args.attention:
        for lr in args.lr:
            for seed in args.seeds:
                if name == attentions.NO_ATTENTION and floors.get((lr, seed)) is not None:
                    continue  # trained above as the floor
                train(name, lr, seed, floors.get((lr, seed)))
    print("\n" + "\n".join([header] + rows))
    if args.task == "lm":
        print("(lm: the loss column is test bits per byte; accuracy is next-byte accuracy)")
    print("\nbest learning rate per attention (this invocation; failed runs left out):")
    for line in plot.summary_lines([r for r in records if r["status"] in ("ok", "floor", "unjudged")]):
        print("  " + line)
    failed = [r for r in records if r["status"] in ("diverged", "learned_nothing")]
    if failed:
        print(f"\n{len(failed)} failed run(s):")
        for r in failed:
            print(f"  {r['label']} lr={r['lr']:g} seed={r['seed']}: {r['status']}: {r['failure']}")
    everything = plot.load([results_path])
    try:
        print(f"wrote {results_path} ({len(everything)} records) and "
              f"{plot.plot_task([r for r in everything if r['task'] == args.task], args.task, args.out)}")
    except ImportError as error:  # matplotlib missing: the results are kept
        print(f"wrote {results_path}; no plot ({error})")
    return records


if __name__ == "__main__":
    main()
