"""Pretrained BERT converted to YOSO against the same model with softmax at 512 and YOSO from scratch.

    python benchmarks/convert_pretrained.py --pretrained /tmp/all-MiniLM-L6-v2 --data-dir ../shared/data/imdb \\
        --learning-rates 5e-5 2e-4 --seeds 0 1 2 --out runs/convert/imdb -- --train-examples 480 --test-examples 300

Runs examples/convert_pretrained.py once per --mode (yoso, softmax, scratch), learning rate and seed, each
in its own process with the same data, steps and batch size (the arguments after `--` go to every run),
then prints a table of test accuracy (each seed, mean, and the training seconds) and writes
<out>/convert_pretrained.png and <out>/results.json. A run whose metrics.json exists is not run again,
so an interrupted sweep continues where it stopped. Without --data-dir: the built-in long-range task.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "convert_pretrained.py")
MODES = ("yoso", "softmax", "scratch")


def run_dir(out, mode, learning_rate, seed):
    return os.path.join(out, f"{mode}-lr{learning_rate:g}-seed{seed}")


def run_one(args, mode, learning_rate, seed):
    """metrics.json of one run (run now unless it exists)."""
    directory = run_dir(args.out, mode, learning_rate, seed)
    path = os.path.join(directory, "metrics.json")
    if not os.path.exists(path):
        command = [sys.executable, EXAMPLE, "--pretrained", args.pretrained, "--mode", mode,
                   "--learning-rate", str(learning_rate), "--seed", str(seed), "--output-dir", directory]
        command += ["--data-dir", args.data_dir] if args.data_dir else []
        print(f"== {mode} lr={learning_rate:g} seed={seed}: {' '.join(command[1:] + args.example_args)}", flush=True)
        start = time.perf_counter()
        subprocess.run(command + args.example_args, check=True, cwd=os.path.dirname(EXAMPLE))
        print(f"== done in {time.perf_counter() - start:.0f} s", flush=True)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def table(records, learning_rates, seeds):
    lines = ["| model | lr | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | train s / run |",
             "| --- | ---: | " + " | ".join("---:" for _ in seeds) + " | ---: | ---: |"]
    for mode in MODES:
        for learning_rate in learning_rates:
            runs = [records.get((mode, learning_rate, seed)) for seed in seeds]
            done = [r for r in runs if r]
            if not done:
                continue
            accuracies = [r["test_accuracy"] for r in done]
            cells = [f"{100 * r['test_accuracy']:.1f}%" if r else "-" for r in runs]
            seconds = sum(r["train_seconds"] for r in done) / len(done)
            lines.append(f"| {mode} | {learning_rate:g} | " + " | ".join(cells)
                         + f" | {100 * sum(accuracies) / len(accuracies):.1f}% | {seconds:.0f} |")
    return "\n".join(lines)


def plot(records, learning_rates, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for offset, learning_rate in enumerate(learning_rates):
        for position, mode in enumerate(MODES):
            values = [100 * r["test_accuracy"] for (m, lr, _), r in records.items() if m == mode and lr == learning_rate]
            x = position + (offset - (len(learning_rates) - 1) / 2) * 0.25
            if values:
                axis.bar(x, sum(values) / len(values), width=0.22, color=f"C{offset}", alpha=0.5,
                         label=f"lr {learning_rate:g}" if position == 0 else None)
                axis.plot([x] * len(values), values, "k.", markersize=8)
    axis.set_xticks(range(len(MODES)), ["pretrained, YOSO\n(converted)", "pretrained, softmax\n(truncated to 512)",
                                        "YOSO from scratch"])
    axis.set_ylabel("test accuracy (%): bars mean, dots seeds")
    axis.axhline(50, color="gray", linestyle=":", linewidth=1)
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def fidelity(args):
    """Before any fine-tuning: how close the converted model's sentence embeddings (the mean of its token
    vectors, as sentence-transformers pools) are to the pretrained softmax model's, on --fidelity
    texts (IMDB test reviews with --data-dir, else built-in documents) cut to 512 tokens. Rows: YOSO at
    a few (m, tau), and YOSO-E (the expectation, no sampling). Prints the mean cosine similarity."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import convert_pretrained  # imports Keras first (quietly), then keras_hub below
    import keras
    import keras_hub
    import numpy as np

    import keras_yoso

    if args.data_dir:
        texts = convert_pretrained.load_imdb(args.data_dir)[1].texts[:args.fidelity]
    else:
        texts = convert_pretrained.long_range_data.generate_documents(args.fidelity, 0, length=510)[0]
    ids = convert_pretrained.PretrainedTokenizer(args.pretrained, 512).encode(texts)
    backbone = keras_hub.models.BertBackbone.from_preset(args.pretrained)

    def embeddings(model):
        rows = []
        for row in ids:
            out = model({"token_ids": row[None], "segment_ids": np.zeros_like(row[None]),
                         "padding_mask": np.ones_like(row[None], bool)})["sequence_output"]
            rows.append(keras.ops.convert_to_numpy(out)[0].mean(axis=0))
        rows = np.stack(rows)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    reference = embeddings(backbone)
    settings = [("YOSO m=32, tau=8", dict(num_hashes=32, hash_code_len=8)),
                ("YOSO m=32, tau=6", dict(num_hashes=32, hash_code_len=6)),
                ("YOSO m=128, tau=8", dict(num_hashes=128, hash_code_len=8)),
                ("YOSO-E tau=8 (expectation)", dict(use_expectation=True, hash_code_len=8))]
    print(f"| converted attention | mean cosine to softmax's embedding ({len(ids)} texts, <= 512 tokens) |")
    print("| --- | ---: |")
    for name, kwargs in settings:
        converted = keras_yoso.replace_attention(backbone, "yoso", seed=0, **kwargs)
        print(f"| {name} | {float(np.mean(np.sum(embeddings(converted) * reference, axis=1))):.3f} |", flush=True)
    shuffled = np.roll(reference, 1, axis=0)
    print(f"| (softmax, another text's embedding) | {float(np.mean(np.sum(shuffled * reference, axis=1))):.3f} |")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    example_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", required=True, help="Hugging Face BERT checkpoint folder")
    parser.add_argument("--data-dir", default=None, help="IMDB folder; default: the built-in long-range task")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[5e-5, 2e-4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", help="folder of the runs, results.json and the figure")
    parser.add_argument("--fidelity", type=int, default=None, metavar="N",
                        help="instead of training: the converted models' embeddings against softmax's on N texts")
    args = parser.parse_args(argv)
    if args.fidelity:
        return fidelity(args)
    if not args.out:
        parser.error("--out is required (the folder of the runs)")
    args.example_args = example_args
    os.makedirs(args.out, exist_ok=True)
    records = {}
    for seed in args.seeds:
        for learning_rate in args.learning_rates:
            for mode in args.modes:
                records[(mode, learning_rate, seed)] = run_one(args, mode, learning_rate, seed)
    task = "IMDB" if args.data_dir else "built-in long-range task"
    first = next(iter(records.values()))
    title = (f"{task}: {first['num_train_examples']} training documents, {first['steps']} steps, "
             f"{first['keras_backend']}")
    print(table(records, args.learning_rates, args.seeds))
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump([{"mode": m, "learning_rate": lr, "seed": s, **{k: r[k] for k in (
            "test_accuracy", "test_loss", "train_seconds", "steps", "num_train_examples", "num_test_examples",
            "keras_backend", "yoso_ops", "args")}} for (m, lr, s), r in records.items()], f, indent=2)
    plot(records, args.learning_rates, os.path.join(args.out, "convert_pretrained.png"), title)
    print(f"figure: {os.path.join(args.out, 'convert_pretrained.png')}")


if __name__ == "__main__":
    main()
