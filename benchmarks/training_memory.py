"""What one JAX training step of a converted encoder holds: XLA's buffers, per keras_yoso tree, local window
and XLA CPU scheduler, side by side in one run.

    python benchmarks/training_memory.py --trees /tmp/before /tmp/after --labels before after \\
        --record docs/data/training_memory.json --machine-note "quiet"
    python benchmarks/training_memory.py --render docs/data/training_memory.json

The model has all-MiniLM-L6-v2's shape (keras_hub's BertBackbone: --layers layers, --heads heads, width
--width, feed-forward --ffn, random weights) converted by `keras_yoso.replace_attention` to YOSO (m =
--num-hashes, tau = --hash-code-len) at --length positions, with each of --local-windows beside it (0: none),
then the mean of its token vectors and a 2-class softmax layer, trained with sparse cross-entropy: the step is
`jax.jit(jax.value_and_grad(loss))` of the model's `stateless_call`, on --batch x --length tokens.

Each (tree, window, scheduler) is lowered and compiled, not run, in a fresh process that imports keras_yoso
from that tree (PYTHONPATH; from an empty directory, never the checkout it is run from). Schedulers: "default"
is XLA's CPU scheduler, which starts ops early for concurrency and so can keep buffers alive longer; "serial"
turns that off (`--xla_cpu_enable_concurrency_optimized_scheduler=false`). The table gives XLA's temp
allocation of the step (every buffer besides its arguments and outputs: what the step needs on top of the
weights; on the CPU it is one allocation per step) in MB (10^6 bytes), its ratio to the first tree's, and
which YOSO ops the tree ran (custom_op: its native kernels; composite: keras.ops). It is read from the compiled
executable (`memory_analysis()`), so it depends on the JAX and XLA versions, not on what else runs. With
--steps N each process also runs its step N + 1 times and the table adds the median seconds of the last N and
their ratio to the first tree's: that part does depend on the machine's load (say it in --machine-note).

Prints the table, writes training_memory.png in --out-dir, and with --record appends one record (the command,
the machine, the versions, every row) to that JSON list. `--render RECORDS` measures nothing: it prints the
heading and table of every record (docs/benchmarks.md quotes them; a test compares) and draws record i's
figure as training_memory_<i>.png in --out-dir.
"""

import argparse
import datetime
import os
import sys
import textwrap

import numpy as np

import conversion_error  # beside this script: append_record(), add_record_arguments()
import decoding  # beside this script: machine()
from isolated_run import run_isolated

SCHEDULERS = {"default": "", "serial": "--xla_cpu_enable_concurrency_optimized_scheduler=false"}

_CHILD = r"""
import json, os, sys, time
batch, length, window, layers, heads, width, ffn, num_hashes, tau, steps = map(int, sys.argv[1:11])
import jax, keras, keras_hub, numpy as np
import keras_yoso

backbone = keras_hub.models.BertBackbone(vocabulary_size=30522, num_layers=layers, num_heads=heads, hidden_dim=width,
                                         intermediate_dim=ffn, max_sequence_length=512)
backbone = keras_yoso.replace_attention(backbone, "yoso", max_length=max(length, 512), num_hashes=num_hashes,
                                        hash_code_len=tau, local_window=window or None, seed=0)
token_ids = keras.Input((None,), dtype="int32")
features = backbone({"token_ids": token_ids, "segment_ids": keras.ops.zeros_like(token_ids),
                     "padding_mask": keras.ops.ones_like(token_ids, dtype="bool")})["sequence_output"]
model = keras.Model(token_ids, keras.layers.Dense(2, activation="softmax")(keras.ops.mean(features, axis=1)))
trainable = [v.value for v in model.trainable_variables]
others = [v.value for v in model.non_trainable_variables]

def loss(trainable, others, ids, labels):
    probabilities, _ = model.stateless_call(trainable, others, ids, training=True)
    return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(labels, probabilities))

ids = np.random.default_rng(0).integers(1000, 30000, size=(batch, length)).astype("int32")
labels = np.zeros((batch,), "int32")
start = time.perf_counter()
step = jax.jit(jax.value_and_grad(loss)).lower(trainable, others, ids, labels).compile()
memory = step.memory_analysis()
compile_s = time.perf_counter() - start
seconds = []
for _ in range(steps + 1 if steps else 0):  # the first one untimed
    start = time.perf_counter()
    jax.block_until_ready(step(trainable, others, ids, labels))
    seconds.append(time.perf_counter() - start)
print(json.dumps({"temp_bytes": int(memory.temp_size_in_bytes), "argument_bytes": int(memory.argument_size_in_bytes),
                  "output_bytes": int(memory.output_size_in_bytes), "compile_s": compile_s,
                  "step_s": sorted(seconds[1:])[len(seconds[1:]) // 2] if steps else None,
                  "yoso_ops": "custom_op" if keras_yoso.ops.custom_ops_available() else "composite",
                  "keras_yoso": os.path.dirname(keras_yoso.__file__), "jax": jax.__version__,
                  "keras": keras.__version__}))
"""


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", help="keras_yoso source trees (each holds keras_yoso/, built); the "
                                                   "first is the baseline")
    parser.add_argument("--labels", nargs="+", default=None, help="one per tree. Default: the paths")
    parser.add_argument("--local-windows", type=int, nargs="+", default=[0, 64],
                        help="YosoAttention(local_window=...) of each case, 0 for none. Default: %(default)s")
    parser.add_argument("--schedulers", nargs="+", default=list(SCHEDULERS), choices=list(SCHEDULERS),
                        help="XLA CPU schedulers. Default: %(default)s")
    parser.add_argument("--batch", type=int, default=8, help="Default: %(default)s")
    parser.add_argument("--length", type=int, default=2048, help="tokens per example. Default: %(default)s")
    parser.add_argument("--layers", type=int, default=6, help="Default: %(default)s (all-MiniLM-L6-v2)")
    parser.add_argument("--heads", type=int, default=12, help="Default: %(default)s")
    parser.add_argument("--width", type=int, default=384, help="Default: %(default)s")
    parser.add_argument("--ffn", type=int, default=1536, help="Default: %(default)s")
    parser.add_argument("--num-hashes", type=int, default=32, help="Default: %(default)s")
    parser.add_argument("--hash-code-len", type=int, default=8, help="Default: %(default)s")
    parser.add_argument("--steps", type=int, default=0,
                        help="also run the step this many times after one untimed run and give the median seconds "
                             "(0: compile only). Default: %(default)s")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per configuration. Default: %(default)s")
    conversion_error.add_record_arguments(parser, os.path.join("runs", "training_memory"))
    args = parser.parse_args(argv)
    if args.render:
        return args
    args.trees = args.trees or []
    args.labels = args.labels or args.trees
    if not args.trees:
        parser.error("--trees: expected at least 1 path, got none")
    if len(args.labels) != len(args.trees):
        parser.error(f"--labels: expected one per tree ({len(args.trees)}), got {len(args.labels)}")
    for tree in args.trees:
        if not os.path.isfile(os.path.join(tree, "keras_yoso", "__init__.py")):
            parser.error(f"--trees: expected folders holding keras_yoso/__init__.py, got {tree!r}")
    for window in args.local_windows:
        if window < 0:
            parser.error(f"--local-windows: expected integers >= 0 (0: no window), got {window}")
    if args.steps < 0:
        parser.error(f"--steps: expected an integer >= 0 (0: compile only), got {args.steps}")
    for name in ("batch", "length", "layers", "heads", "width", "ffn", "num_hashes", "hash_code_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if args.width % args.heads:
        parser.error(f"--width: expected a multiple of --heads ({args.heads}), got {args.width}")
    return args


def measure(args):
    """One row per (window, scheduler, tree), trees innermost: {"window", "scheduler", "label", "status", ...}."""
    rows = []
    for window in args.local_windows:
        for scheduler in args.schedulers:
            for label, tree in zip(args.labels, args.trees):
                # keras_yoso from `tree` (ahead of any installed one), JAX on the CPU with `scheduler`.
                environment = {"PYTHONPATH": os.pathsep.join([os.path.abspath(tree)] + [p for p in os.environ.get(
                    "PYTHONPATH", "").split(os.pathsep) if p]), "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
                               "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {SCHEDULERS[scheduler]}".strip()}
                result = run_isolated(_CHILD, [args.batch, args.length, window, args.layers, args.heads, args.width,
                                               args.ffn, args.num_hashes, args.hash_code_len, args.steps],
                                      args.timeout, environment)
                rows.append(dict(result, window=window, scheduler=scheduler, label=label))
                print(f"  {label}, window {window or 'none'}, {scheduler} scheduler: "
                      + (f"{result['temp_bytes'] / 1e6:,.0f} MB" if result["status"] == "ok" else result["status"])
                      + (f", {result['step_s']:.2f} s a step" if result.get("step_s") else ""),
                      flush=True)
    return rows


def _mb(row):
    return row["temp_bytes"] / 1e6 if row["status"] == "ok" else None


def table(rows, labels):
    """One line per (window, scheduler): each tree's MB and its ratio to the first's; with timed rows also each
    tree's median seconds per step and that ratio."""
    timed = any(row.get("step_s") for row in rows)
    head = ["local window", "XLA CPU scheduler"] + [f"{label} MB" for label in labels]
    head += [f"{label} / {labels[0]}" for label in labels[1:]]
    if timed:
        head += [f"{label} s/step" for label in labels] + [f"{label} / {labels[0]} time" for label in labels[1:]]
    lines = ["| " + " | ".join(head) + " |", "| ---: | --- |" + " ---: |" * (len(head) - 2)]
    for start in range(0, len(rows), len(labels)):
        group = rows[start:start + len(labels)]
        cells = [str(group[0]["window"] or "none"), group[0]["scheduler"]]
        for values, form in [([_mb(row) for row in group], "{:,.0f}")] + (
                [([row.get("step_s") for row in group], "{:.2f}")] if timed else []):
            cells += [form.format(value) if value is not None else row["status"] for value, row in zip(values, group)]
            cells += [f"{value / values[0]:.2f}" if value is not None and values[0] else "-" for value in values[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def heading(shapes, machine, rows):
    """The line above the table: the model, the step's shapes, what ran it and the machine."""
    ok = [row for row in rows if row["status"] == "ok"]
    ops = sorted({f"{row['label']}: {row['yoso_ops']}" for row in ok})
    versions = f"JAX {ok[0]['jax']}, Keras {ok[0]['keras']}" if ok else "no configuration compiled"
    steps = shapes.get("steps", 0)  # records before --steps: compile only
    timing = f", seconds a step the median of {steps} after one untimed" if steps else ""
    return (f"XLA temp MB of one training step: {shapes['layers']} layers, {shapes['heads']} heads, width "
            f"{shapes['width']}, FFN {shapes['ffn']}, YOSO m = {shapes['num_hashes']}, "
            f"tau = {shapes['hash_code_len']}, batch {shapes['batch']} x {shapes['length']} tokens{timing}; "
            f"YOSO ops {', '.join(ops)}; {versions}; machine: {machine['cpu']}, {machine['note']}")


def _labels(record):
    return [tree["label"] for tree in record["trees"]]


def render(records):
    """The heading and table of each of `records`, as main printed them, a blank line between."""
    return "\n\n".join(heading(r["shapes"], r["machine"], r["rows"]) + "\n" + table(r["rows"], _labels(r))
                       for r in records)


def plot(rows, labels, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [rows[start:start + len(labels)] for start in range(0, len(rows), len(labels))]
    figure, axis = plt.subplots(figsize=(1.6 + 1.3 * len(groups), 3.8))
    x = np.arange(len(groups))
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        axis.bar(x + (i - (len(labels) - 1) / 2) * width, [_mb(group[i]) or 0.0 for group in groups], width,
                 label=label)
    axis.set_xticks(x, [f"window {g[0]['window'] or 'none'}\n{g[0]['scheduler']}" for g in groups], fontsize=8)
    axis.set_ylabel("XLA temp MB of one training step")
    axis.legend(fontsize=8)
    figure.suptitle(textwrap.fill(title, 110), fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw(records, out_dir):
    """Record i of `records` as out_dir/training_memory_<i>.png, as main drew it; the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"training_memory_{i}.png") for i in range(len(records))]
    for record, figure in zip(records, paths):
        plot(record["rows"], _labels(record), figure, heading(record["shapes"], record["machine"], record["rows"]))
    return paths


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.render:
        return conversion_error.show_records(args.render, render, draw, args.out_dir)
    rows = measure(args)
    shapes = {name: getattr(args, name) for name in ("batch", "length", "layers", "heads", "width", "ffn",
                                                     "num_hashes", "hash_code_len", "steps")}
    machine = {"cpu": decoding.machine(), "note": args.machine_note}
    print(heading(shapes, machine, rows))
    print(table(rows, args.labels))
    os.makedirs(args.out_dir, exist_ok=True)
    figure = os.path.join(args.out_dir, "training_memory.png")
    plot(rows, args.labels, figure, heading(shapes, machine, rows))
    print(f"wrote {figure}")
    if args.record:
        record = {"command": " ".join([os.path.basename(sys.executable), *(sys.argv if argv is None else
                                                                            ["benchmarks/training_memory.py", *argv])]),
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "machine": dict(machine, quiet=args.machine_note.startswith("quiet")),
                  "trees": [{"label": label, "path": os.path.abspath(tree)} for label, tree in zip(args.labels,
                                                                                                   args.trees)],
                  "shapes": shapes, "rows": rows}
        conversion_error.append_record(args.record, record)
        print(f"appended the record to {args.record}")


if __name__ == "__main__":
    main()
