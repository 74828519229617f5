"""A byte-level causal language model with YOSO (or linear / softmax) attention, trained with
`model.fit` and then generating with a constant-size decoding state.

Built-in task (no data needed): passkey retrieval. Each sequence states a random 5-digit key
once, within its first 256 bytes, hides it in filler sentences, and asks for it at the end:

    ... The pass key is 48213. Remember it. 48213 is the pass key. <filler> ...
    ... What is the pass key? The pass key is 48213.

With the default 2,560 bytes, the key is at least 2,048 positions before the question, so a
model answers only if its attention carries the key over that distance. Training is next-byte
prediction on the whole sequence (the key digits after the question weighted
`--answer-weight` times); the test prefills each test sequence up to "The pass key is " and
generates 5 bytes (`keras_yoso.models.CausalLM.generate`: one prefill call, then one compiled
loop of single-token decoding steps through the layers' caches).

    python examples/causal_lm.py                                  # YOSO, the built-in task
    python examples/causal_lm.py --attention linear_relative      # or softmax, same budget
    python examples/causal_lm.py --data-dir ~/texts               # filler from your .txt files

Outputs (`--output-dir`, default runs/causal_lm-<attention>-<backend>/):
    metrics.json   task accuracy of the generated answers (exact key, per digit), bits per byte on
                   the test sequences, time, all arguments, the history (training loss of every step,
                   bits per byte on the first 16 test sequences at each evaluation during training)
    history.png    one curve per metric against the training step: the training loss of each step, the
                   bits per byte on the first 16 test sequences

There is no validation split: the evaluations during training score the first 16 test sequences
(all of them when --test-sequences is smaller), to show progress; nothing is selected on them.

It prints what it is doing from the start (each phase with its sizes), then the training loss every
--progress-every steps with the elapsed time.
"""

import argparse
import json
import math
import pathlib
import sys
import time

import numpy as np

ATTENTIONS = ("yoso", "linear_relative", "softmax")
KEY_DIGITS = 5
# Test sequences scored at each evaluation during training: the first ones, up to this many.
EVALUATION_SEQUENCES = 16
QUESTION = b" What is the pass key? The pass key is "
FILLER = [
    b"The grass is green.", b"The sky is blue.", b"The sun is yellow.", b"Here we go.", b"There and back again.",
    b"The river flows to the sea.", b"A cat sleeps on the warm mat.", b"Rain falls on the old roof.",
    b"The road winds up the hill.", b"Birds sing in the early morning.", b"The wind moves the tall trees.",
    b"A ship sails past the harbour.",
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attention", choices=ATTENTIONS, default="yoso", help="Default: %(default)s")
    parser.add_argument("--sequence-length", type=int, default=2560,
                        help="bytes per training sequence (the key is in the first 256). Default: %(default)s")
    parser.add_argument("--train-sequences", type=int, default=2048, help="Default: %(default)s")
    parser.add_argument("--test-sequences", type=int, default=64, help="Default: %(default)s")
    parser.add_argument("--data-dir", default=None,
                        help="a directory of .txt files: filler comes from their bytes instead of the built-in "
                             "sentences (the passkey task stays the same)")
    parser.add_argument("--steps", type=int, default=200, help="training steps. Default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=8, help="Default: %(default)s")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="Default: %(default)s")
    parser.add_argument("--answer-weight", type=float, default=20.0,
                        help="loss weight of the answer digits (1 for every other byte). Default: %(default)s")
    parser.add_argument("--hidden-dim", type=int, default=64, help="Default: %(default)s")
    parser.add_argument("--num-layers", type=int, default=2, help="Default: %(default)s")
    parser.add_argument("--num-heads", type=int, default=2, help="Default: %(default)s")
    parser.add_argument("--num-hashes", type=int, default=16, help="YOSO m. Default: %(default)s")
    parser.add_argument("--hash-code-len", type=int, default=8, help="YOSO tau. Default: %(default)s")
    parser.add_argument("--conv-window", type=int, default=0,
                        help="YOSO only: add YOSO-C's causal convolution of this width (0: none). Default: "
                             "%(default)s, so that every --attention trains the same model (a learned window "
                             "of local context alone cuts bits per byte several-fold: docs/results.md)")
    parser.add_argument("--horizon", type=int, default=16, help="LinearRelativeAttention horizon. Default: %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="Default: %(default)s")
    parser.add_argument("--output-dir", default=None, help="Default: runs/causal_lm-<attention>-<backend>")
    parser.add_argument("--progress-every", type=int, default=None,
                        help="steps between progress lines (default: steps // 20, at most 10)")
    args = parser.parse_args(argv)
    if args.progress_every is None:
        args.progress_every = max(1, min(10, args.steps // 20))
    for name in ("sequence_length", "train_sequences", "test_sequences", "steps", "batch_size", "hidden_dim",
                 "num_layers", "num_heads", "num_hashes", "hash_code_len", "horizon", "progress_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.sequence_length < 512:
        parser.error(f"--sequence-length must be >= 512 (room for the key, filler and question), got "
                     f"{args.sequence_length}")
    if args.data_dir is not None and not pathlib.Path(args.data_dir).is_dir():
        parser.error(f"--data-dir {args.data_dir!r} is not a directory")
    return args


class FillerSource:
    """Filler bytes: random built-in sentences, or random windows of the --data-dir texts."""

    def __init__(self, data_dir=None):
        self.text = None
        if data_dir is not None:
            files = sorted(pathlib.Path(data_dir).rglob("*.txt"))
            if not files:
                raise SystemExit(f"--data-dir {data_dir!r} holds no .txt file")
            text = b" ".join(f.read_bytes() for f in files)
            self.text = bytes(text.replace(b"\n", b" "))
            if len(self.text) < 4096:
                raise SystemExit(f"--data-dir {data_dir!r} holds {len(self.text)} bytes of text; need >= 4096")

    def take(self, rng, size):
        if size <= 0:
            return b""
        if self.text is not None:
            start = int(rng.integers(0, len(self.text) - size)) if len(self.text) > size else 0
            return (self.text[start:start + size] * (1 + size // max(1, len(self.text))))[:size]
        out = bytearray()
        while len(out) < size:
            out += FILLER[int(rng.integers(len(FILLER)))] + b" "
        return bytes(out[:size])


def passkey_sequence(rng, length, filler):
    """(bytes of `length` + 1, key, answer start): the key stated within the first 256 bytes, filler, the
    question at the end, the key digits from `answer start` on (followed by '.')."""
    key = "".join(str(d) for d in rng.integers(0, 10, KEY_DIGITS)).encode()
    statement = b" The pass key is " + key + b". Remember it. " + key + b" is the pass key. "
    head = filler.take(rng, int(rng.integers(0, 256 - len(statement))))
    tail = QUESTION + key + b"."
    body = filler.take(rng, length + 1 - len(head) - len(statement) - len(tail))
    sequence = head + statement + body + tail
    assert len(sequence) == length + 1
    return np.frombuffer(sequence, np.uint8).astype(np.int32), key, length + 1 - KEY_DIGITS - 1


def make_split(rng, count, length, filler, answer_weight):
    """x [count, length], y [count, length] (next bytes), weights, keys, answer starts."""
    sequences, keys, starts = zip(*(passkey_sequence(rng, length, filler) for _ in range(count)))
    sequences = np.stack(sequences)
    weights = np.ones((count, length), np.float32)
    for row, start in enumerate(starts):
        weights[row, start - 1:start - 1 + KEY_DIGITS] = answer_weight  # targets at the key digits
    return sequences[:, :-1], sequences[:, 1:], weights, list(keys), np.array(starts)


def build_model(args, keras_yoso):
    attention_kwargs = {}
    if args.attention == "yoso":
        attention_kwargs = {"num_hashes": args.num_hashes, "hash_code_len": args.hash_code_len,
                            "conv_window": args.conv_window or None}
    elif args.attention == "linear_relative":
        attention_kwargs = {"horizon": args.horizon}
    return keras_yoso.models.CausalLM(
        256, args.sequence_length, hidden_dim=args.hidden_dim, num_layers=args.num_layers, num_heads=args.num_heads,
        intermediate_dim=2 * args.hidden_dim, attention=args.attention,
        attention_kwargs={**attention_kwargs, "seed": args.seed})


def bits_per_byte(model, x, y, batch_size):
    """Mean next-byte cross-entropy over every position of the test sequences, in bits."""
    import keras

    total, count = 0.0, 0
    for start in range(0, len(x), batch_size):
        logits = keras.ops.convert_to_numpy(model(x[start:start + batch_size], training=False)).astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        target = y[start:start + batch_size]
        total -= np.take_along_axis(log_probs, target[..., None], -1).sum()
        count += target.size
    return total / count / math.log(2)


def answer_accuracy(model, x, keys, starts, batch_size):
    """(exact-key accuracy, per-digit accuracy, generated answers): greedy generation of the key digits from
    the prompt that ends with "The pass key is "."""
    import keras

    exact, digits, answers = 0, 0, []
    for start in range(0, len(x), batch_size):
        rows = range(start, min(len(x), start + batch_size))
        prompt_length = int(starts[rows[0]])
        assert all(int(starts[r]) == prompt_length for r in rows)
        prompt = x[list(rows), :prompt_length]
        generated = keras.ops.convert_to_numpy(model.generate(prompt, KEY_DIGITS))
        for r, row in zip(rows, generated):
            answer = bytes(int(b) for b in row)
            answers.append(answer.decode("latin-1"))
            exact += answer == keys[r]
            digits += sum(a == b for a, b in zip(answer, keys[r]))
    return exact / len(x), digits / (len(x) * KEY_DIGITS), answers


def progress(message, started):
    """One progress line, with the seconds since the run started."""
    print(f"[{time.time() - started:6.1f} s] {message}", flush=True)


def step_losses(running_means):
    """The loss of each step from Keras' running means of one epoch (`logs["loss"]` after batch k is
    the mean of its first k losses, and restarts at every epoch): loss_k = k mean_k - (k - 1) mean_(k-1)."""
    means = np.asarray(running_means, np.float64)
    counts = np.arange(1, len(means) + 1)
    return means * counts - np.concatenate([[0.0], means[:-1] * counts[:-1]])


def save_history(path, losses, evaluations, title):
    """One curve per metric against the training step: the loss of every step (left), the bits per byte
    on the first test sequences at each evaluation (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(np.arange(1, len(losses) + 1), losses, alpha=0.8)
    left.set_ylabel("training loss per step (weighted, nats)")
    if evaluations:
        steps, values = zip(*evaluations)
        right.plot(steps, values, "o-")
    right.set_ylabel(f"bits per byte, first {EVALUATION_SEQUENCES} test sequences")
    for axis in (left, right):
        axis.set_xlabel("training step")
        axis.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    run_started = time.time()
    progress("importing Keras and keras_yoso", run_started)
    import keras

    import keras_yoso

    keras.utils.set_random_seed(args.seed)
    backend = keras.backend.backend()
    output_dir = pathlib.Path(args.output_dir or f"runs/causal_lm-{args.attention}-{backend}")
    output_dir.mkdir(parents=True, exist_ok=True)
    progress(f"generating {args.train_sequences} training and {args.test_sequences} test passkey sequences of "
             f"{args.sequence_length} bytes", run_started)
    rng = np.random.default_rng(args.seed)
    filler = FillerSource(args.data_dir)
    x, y, w, _, _ = make_split(rng, args.train_sequences, args.sequence_length, filler, args.answer_weight)
    tx, ty, _, test_keys, test_starts = make_split(np.random.default_rng(args.seed + 10_000), args.test_sequences,
                                                   args.sequence_length, filler, 1.0)
    progress("building the model", run_started)
    model = build_model(args, keras_yoso)
    model(np.zeros((1, 1), "int32"))  # builds the weights (one token), so that the parameters can be counted
    progress(f"model: {args.attention} attention, {args.num_layers} layers of width {args.hidden_dim}, "
             f"{model.count_params():,} parameters, Keras backend {backend}", run_started)
    schedule = keras.optimizers.schedules.CosineDecay(0.0, args.steps, alpha=0.05, warmup_target=args.learning_rate,
                                                      warmup_steps=max(1, args.steps // 10))
    model.compile(optimizer=keras.optimizers.Adam(schedule, clipnorm=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile="auto")
    evaluations, losses = [], []
    every = -(-args.steps // min(4, args.steps))  # steps between evaluations: 4 evaluations at most
    evaluated = min(EVALUATION_SEQUENCES, len(tx))
    batch_rng = np.random.default_rng(args.seed + 1)

    class Batches(keras.utils.PyDataset):
        """`count` random training batches (sequences drawn with replacement)."""

        def __init__(self, count):
            super().__init__()
            self.count = count

        def __len__(self):
            return self.count

        def __getitem__(self, index):
            rows = batch_rng.integers(0, len(x), args.batch_size)
            return x[rows], y[rows], w[rows]

    class Record(keras.callbacks.Callback):
        """The loss of every step (Keras logs the running mean of the epoch), a progress line every
        --progress-every steps, and the bits per byte on the first test sequences at each epoch end
        (one `fit` epoch per evaluation interval)."""

        def on_epoch_begin(self, epoch, logs=None):
            self.running_means = []

        def on_train_batch_end(self, batch, logs=None):
            self.running_means.append(float(logs["loss"]))
            losses.append(float(step_losses(self.running_means)[-1]))
            step = len(losses)
            if step == 1 or step % args.progress_every == 0:
                recent = losses[-args.progress_every:]
                progress(f"step {step}/{args.steps}: loss {np.mean(recent):.4f} (mean of the last {len(recent)} "
                         f"steps), {(time.time() - started) / step:.2f} s/step", run_started)

        def on_epoch_end(self, epoch, logs=None):
            # Between epochs: on JAX the model's variables are only synced back at epoch ends.
            bpb = bits_per_byte(model, tx[:evaluated], ty[:evaluated], args.batch_size)
            evaluations.append((len(losses), bpb))
            progress(f"step {len(losses)}/{args.steps}: test bits/byte {bpb:.3f} (the first {evaluated} of "
                     f"{len(tx)} test sequences)", run_started)

    progress(f"training {args.steps} steps of batch {args.batch_size}, evaluating every {every} steps on the first "
             f"{evaluated} test sequences (the first step also compiles the model)", run_started)
    started = time.time()
    record = Record()
    while len(losses) < args.steps:
        model.fit(Batches(min(every, args.steps - len(losses))), epochs=1, callbacks=[record], verbose=0)
    train_seconds = time.time() - started
    progress(f"testing: bits per byte of {len(tx)} test sequences, then generating their {KEY_DIGITS}-digit keys",
             run_started)
    started = time.time()
    bpb = bits_per_byte(model, tx, ty, args.batch_size)
    exact, per_digit, answers = answer_accuracy(model, tx, test_keys, test_starts, args.batch_size)
    test_seconds = time.time() - started
    metrics = {
        "task": "passkey" + ("" if args.data_dir is None else " (filler from --data-dir)"),
        "attention": args.attention, "backend": backend,
        "implementation": keras_yoso.ops.implementation_in_use() if args.attention == "yoso" else None,
        "answer_accuracy": exact, "answer_digit_accuracy": per_digit, "chance_digit_accuracy": 0.1,
        "test_bits_per_byte": bpb, "train_seconds": round(train_seconds, 1), "test_seconds": round(test_seconds, 1),
        "steps": args.steps, "parameters": model.count_params(),
        "examples": [{"key": k.decode(), "generated": a} for k, a in list(zip(test_keys, answers))[:8]],
        "evaluated_test_sequences": evaluated, "test_bits_per_byte_during_training": evaluations,
        "training_loss_per_step": losses, "arguments": vars(args),
    }
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    save_history(output_dir / "history.png", losses, evaluations,
                 f"{args.attention} on {backend}: passkey at {args.sequence_length} bytes")
    print(f"{args.attention} ({backend}): answer accuracy {exact:.1%} (digits {per_digit:.1%}, chance 10%), "
          f"test bits/byte {bpb:.3f}, trained {train_seconds:.0f} s; wrote {output_dir}/metrics.json and "
          "history.png")
    return metrics


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
