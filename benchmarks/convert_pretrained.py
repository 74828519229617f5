"""Pretrained BERT converted to YOSO against the same model with softmax at 512 and YOSO from scratch.

    python benchmarks/convert_pretrained.py --pretrained /tmp/all-MiniLM-L6-v2 --data-dir ../shared/data/imdb \\
        --learning-rates 5e-5 2e-4 --seeds 0 1 2 --out runs/convert/imdb -- --train-examples 480 --test-examples 300

Runs examples/convert_pretrained.py once per --mode (yoso, transferred, softmax, scratch), learning rate and seed, each
in its own process with the same data, steps and batch size (the arguments after `--` go to every run),
then prints a table of test accuracy (each seed, mean, and the training seconds) and writes
<out>/convert_pretrained.png and <out>/results.json. A run whose metrics.json exists is not run again,
so an interrupted sweep continues where it stopped. Without --data-dir: the built-in long-range task, and
under the table and in the figure the most that softmax's window (the checkpoint's positions) allows on
each seed's test documents (the runs' truncation_ceiling).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "convert_pretrained.py")
MODES = ("yoso", "transferred", "softmax", "scratch")


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


def plot(records, learning_rates, path, title, ceiling=None):
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
    axis.set_xticks(range(len(MODES)), ["pretrained, YOSO\n(converted)", "pretrained, YOSO\n(transferred)",
                                        "pretrained, softmax\n(truncated to 512)", "YOSO from scratch"])
    axis.set_ylabel("test accuracy (%): bars mean, dots seeds")
    axis.axhline(50, color="gray", linestyle=":", linewidth=1)
    if ceiling is not None:
        axis.axhline(100 * ceiling, color="C3", linestyle="--", linewidth=1,
                     label=f"the most softmax's positions allow ({100 * ceiling:.1f}%)")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def fidelity(args):
    """examples/convert_pretrained.py --fidelity: the converted models before any fine-tuning."""
    command = [sys.executable, EXAMPLE, "--pretrained", args.pretrained, "--fidelity", str(args.fidelity)]
    subprocess.run(command + (["--data-dir", args.data_dir] if args.data_dir else []), check=True,
                   cwd=os.path.dirname(EXAMPLE))


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
    ceilings = {s: r["args"]["truncation_ceiling"] for (_, _, s), r in records.items()
                if "truncation_ceiling" in r["args"]}  # the built-in task's; the same test documents in every mode
    if ceilings:
        print("the most a model that reads only the checkpoint's positions (softmax) can reach on the test documents: "
              + ", ".join(f"{100 * c:.1f}% (seed {s})" for s, c in sorted(ceilings.items())))
    with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
        json.dump([{"mode": m, "learning_rate": lr, "seed": s, **{k: r[k] for k in (
            "test_accuracy", "test_loss", "train_seconds", "steps", "num_train_examples", "num_test_examples",
            "keras_backend", "yoso_ops", "args")}} for (m, lr, s), r in records.items()], f, indent=2)
    plot(records, args.learning_rates, os.path.join(args.out, "convert_pretrained.png"), title,
         sum(ceilings.values()) / len(ceilings) if ceilings else None)
    print(f"figure: {os.path.join(args.out, 'convert_pretrained.png')}")


if __name__ == "__main__":
    main()
