"""Pretrained BERT converted to YOSO against the same model with softmax at 512 and YOSO from scratch.

    python benchmarks/convert_pretrained.py --pretrained /tmp/all-MiniLM-L6-v2 --data-dir ../shared/data/imdb \\
        --learning-rates 5e-5 2e-4 --seeds 0 1 2 --out runs/convert/imdb -- --train-examples 480 --test-examples 300

Runs examples/convert_pretrained.py once per --mode (yoso, transferred, softmax, scratch), learning rate and seed, each
in its own process with the same data, steps and batch size (the arguments after `--` go to every run, less
the options the example's MODE_OPTIONS gives only to other modes: YOSO's to the YOSO modes, transfer's to
transferred),
then prints a table of test accuracy (each seed, mean, and the training seconds) and writes
<out>/convert_pretrained.png and <out>/results.json. A run whose metrics.json exists is not run again,
so an interrupted sweep continues where it stopped. Without --data-dir: the built-in long-range task, and
under the table and in the figure the most that softmax's window (the checkpoint's positions) allows on
each seed's test documents (the runs' truncation_ceiling).

With --protocol, each mode follows the quality protocol (benchmarks/quality/protocol.py, issue 43):

    python benchmarks/convert_pretrained.py --protocol --pretrained /tmp/all-MiniLM-L6-v2 \
        --data-dir ../shared/data/imdb --learning-rates 2e-5 5e-5 2e-4 --out runs/convert/protocol \
        -- --train-examples 2000 --test-examples 1000 --steps 400

seed 0 at every --learning-rates (at least 3); the rate of the best VALIDATION accuracy (the example's
--validation-fraction of the training documents; the test split is never read for a decision), one rate
beyond it by --extend-factor while it is at the edge (at most --max-extensions times); then seeds 1 and 2
at the chosen rate. A run whose validation loss is not finite diverged; one whose validation accuracy does
not beat answering the majority class by FLOOR_MARGIN learned nothing: both are failed runs, never chosen
and never averaged. The table gives each mode's validation accuracy per rate, the chosen rate, whether it
is interior, and test accuracy mean [min, max] over the seeds kept; <out>/protocol.json holds the records,
<out>/protocol.png draws them. With --record FILE every finished run's record is also appended to FILE (a
JSON list in docs/data, with the command, the arguments after `--`, the machine, --machine-note and the
date), and a run whose record FILE already holds (same mode, rate, seed and arguments) is reused, so a
protocol stopped in one session resumes in the next from the records alone. --render FILE... prints the
table of recorded runs (one per setting of the arguments after `--`; a mode whose protocol has not run to
its end says so) and, with --figure, draws it; with --write PAGE it also replaces the page's block
`<!-- convert-protocol-table: FILE... -->` ... `<!-- /convert-protocol-table -->`, which
tests/test_quality_records.py holds against the records.
"""

import argparse
import ast
import datetime
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_protocol():
    """benchmarks/quality/protocol.py (the rate choice, extension and summary), loaded by path."""
    spec = importlib.util.spec_from_file_location("quality_protocol", os.path.join(HERE, "quality", "protocol.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


protocol = _load_protocol()
import run as quality_run  # noqa: E402  (benchmarks/quality/run.py, on sys.path once protocol.py is loaded)

EXAMPLE = os.path.join(HERE, "..", "examples", "convert_pretrained.py")


def _example_constant(name):
    """The literal value of the example's module-level `name`, read from its source (importing the example
    would import Keras, and put examples/ on sys.path, in this process)."""
    with open(EXAMPLE, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == name for target in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{EXAMPLE} defines no {name}")


MODES = _example_constant("MODES")
MODE_OPTIONS = _example_constant("MODE_OPTIONS")  # {option: (the modes that read it, default)}
FLOOR_MARGIN = 0.02  # validation accuracy a run must add to the majority class's not to have learned nothing


def run_dir(out, mode, learning_rate, seed):
    return os.path.join(out, f"{mode}-lr{learning_rate:g}-seed{seed}")


def arguments_for_mode(mode, argv):
    """`argv` (the example's options after `--`) less the options MODE_OPTIONS gives only to other modes, each
    with its value (`--option value` or `--option=value`): the example refuses those rather than ignore them."""
    kept, skip_value = [], False
    for token in argv:
        if skip_value:
            skip_value = False
            continue
        option = token.split("=", 1)[0]
        if option in MODE_OPTIONS and mode not in MODE_OPTIONS[option][0]:
            skip_value = "=" not in token
            continue
        kept.append(token)
    return kept


def run_one(args, mode, learning_rate, seed):
    """metrics.json of one run (run now unless it exists)."""
    directory = run_dir(args.out, mode, learning_rate, seed)
    path = os.path.join(directory, "metrics.json")
    if not os.path.exists(path):
        command = [sys.executable, EXAMPLE, "--pretrained", args.pretrained, "--mode", mode,
                   "--learning-rate", str(learning_rate), "--seed", str(seed), "--output-dir", directory]
        command += ["--data-dir", args.data_dir] if args.data_dir else []
        if mode == "transferred":  # one transfer per seed and setting, read back by the other rates' runs
            setting = hashlib.sha256("\x00".join(args.example_args).encode("utf-8")).hexdigest()[:10]
            command += ["--transfer-cache", os.path.join(args.out, f"transferred-seed{seed}-{setting}.keras")]
        command += arguments_for_mode(mode, args.example_args)
        print(f"== {mode} lr={learning_rate:g} seed={seed}: {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        subprocess.run(command, check=True, cwd=os.path.dirname(EXAMPLE))
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


def protocol_record(metrics, mode, learning_rate, seed, phase, args):
    """One run's record for protocol.run_protocol and protocol.summarize: its task (IMDB with --data-dir, else
    the built-in tags task: scored by accuracy), rate, seed, status ("ok", "diverged", "learned_nothing") and
    why, validation and test accuracy."""
    losses = [metrics["test_loss"], *metrics["history"]["val_loss"]]
    floor = metrics["validation_majority_accuracy"] + FLOOR_MARGIN
    status, failure = "ok", None
    if not all(math.isfinite(v) for v in losses):
        status, failure = "diverged", "a validation or test loss is not finite"
    elif metrics["validation_accuracy"] <= floor:
        status, failure = "learned_nothing", (f"validation accuracy {metrics['validation_accuracy']:.4f} does not beat "
                                              f"the majority class ({metrics['validation_majority_accuracy']:.4f}) "
                                              f"by {FLOOR_MARGIN}")
    return {"task": "imdb" if args.data_dir else "tags", "mode": mode, "lr": learning_rate, "seed": seed,
            "status": status, "failure": failure,
            "validation_accuracy": metrics["validation_accuracy"], "accuracy": metrics["test_accuracy"],
            "train_seconds": metrics["train_seconds"], "steps": metrics["steps"],
            "num_train_examples": metrics["num_train_examples"], "num_test_examples": metrics["num_test_examples"],
            "keras_backend": metrics["keras_backend"], "transfer_seconds": metrics["args"].get("transfer_seconds"),
            "example_args": list(args.example_args),
            "protocol": {"phase": phase, "grid": sorted(args.learning_rates), "extend_factor": args.extend_factor,
                         "max_extensions": args.max_extensions, "floor_margin": FLOOR_MARGIN}}


def protocol_table(records_by_mode):
    """The markdown table of each mode's protocol summary (protocol.summarize; its cells protocol.seed0_cell
    and protocol.outcome, as docs/quality.md's tables: a protocol not run to its end says so)."""
    rates = sorted({r["lr"] for records in records_by_mode.values() for r in records if r["seed"] == 0})
    lines = ["| mode | " + " | ".join(f"validation, lr {lr:g}" for lr in rates)
             + " | chosen lr | interior | test accuracy mean [min, max] (seeds kept of run) | failed runs |",
             "| --- | " + " | ".join("---:" for _ in rates) + " | ---: | --- | ---: | --- |"]
    for mode, records in records_by_mode.items():
        row = protocol.summarize(records)
        seed0 = {r["lr"]: r for r in records if r["seed"] == protocol.SEEDS[0]}
        cells = ["—" if lr not in seed0 else protocol.seed0_cell(seed0[lr]) for lr in rates]
        chosen, interior, test = protocol.outcome(row)
        failed = "; ".join(protocol.failed_run(r) for r in row["failed"]) or "none"
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {chosen} | {interior} | {test} | {failed} |")
    return "\n".join(lines)


def _recorded(args, mode, learning_rate, seed):
    """The record of --record for this run (same mode, rate, seed and arguments after `--`), or None."""
    for record in args.recorded:
        if (record.get("mode"), record.get("lr"), record.get("seed"), record.get("example_args")) == (
                mode, learning_rate, seed, list(args.example_args)):
            return record
    return None


def run_protocols(args):
    """--protocol: protocol.run_protocol per mode; prints the table, writes <out>/protocol.json and
    <out>/protocol.png, and with --record appends each new run's record to that file as it finishes."""
    if len(set(args.learning_rates)) < protocol.GRID_MIN:
        raise SystemExit(f"--protocol needs at least {protocol.GRID_MIN} distinct --learning-rates, got "
                         f"{args.learning_rates}")
    record_to = getattr(args, "record", None)
    args.recorded = quality_run.plot.load([record_to]) if record_to and os.path.exists(record_to) else []
    records_by_mode = {}
    for mode in args.modes:
        def train(learning_rate, seed, phase, mode=mode):
            reused = _recorded(args, mode, learning_rate, seed)
            if reused is not None:
                print(f"== {mode} lr={learning_rate:g} seed={seed}: reusing the record of {reused['date']} in "
                      f"{record_to}", flush=True)
                return reused
            record = protocol_record(run_one(args, mode, learning_rate, seed), mode, learning_rate, seed, phase, args)
            if record_to:
                record.update(command=" ".join(["benchmarks/convert_pretrained.py", *args.argv]),
                              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              pretrained=os.path.basename(os.path.normpath(args.pretrained)),
                              machine={**quality_run.machine(), "uname": " ".join(platform.uname()),
                                       "quiet": args.machine_note.strip().lower() == "quiet",
                                       "note": args.machine_note})
                quality_run.append_results(record_to, [record])
                args.recorded.append(record)
            return record

        records_by_mode[mode] = protocol.run_protocol(train, args.learning_rates, args.extend_factor,
                                                      args.max_extensions)
        with open(os.path.join(args.out, "protocol.json"), "w", encoding="utf-8") as f:
            json.dump([r for records in records_by_mode.values() for r in records], f, indent=2)
    print(protocol_table(records_by_mode))
    protocol_plot(records_by_mode, os.path.join(args.out, "protocol.png"))
    print(f"figure: {os.path.join(args.out, 'protocol.png')}")


def protocol_plot(records_by_mode, path, title="fine-tuning under the protocol"):
    """Left: each mode's seed-0 validation accuracy per rate (a failed run as an x at the floor line);
    right: test accuracy of each seed at the chosen rate (dots) and their mean (bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for n, (mode, records) in enumerate(records_by_mode.items()):
        row = protocol.summarize(records)
        rates = sorted(row["validation"])
        left.plot(rates, [row["validation"][lr] if row["validation"][lr] is not None else float("nan") for lr in rates],
                  "o-", color=f"C{n}", label=mode)
        failed = [lr for lr in rates if row["validation"][lr] is None]
        left.plot(failed, [0.5] * len(failed), "x", color=f"C{n}", markersize=9)
        kept = [r["accuracy"] for r in records if r["lr"] == row["chosen_lr"] and not protocol.failed(r)]
        if kept:
            right.bar(n, sum(kept) / len(kept), color=f"C{n}", alpha=0.5)
            right.plot([n] * len(kept), kept, "k.", markersize=8)
    left.set_xscale("log")
    left.set_xlabel("learning rate (seed 0)")
    left.set_ylabel("validation accuracy (x: a failed run)")
    left.legend()
    right.set_xticks(range(len(records_by_mode)), list(records_by_mode))
    right.set_ylabel("test accuracy at the chosen rate")
    right.axhline(0.5, color="gray", linestyle=":", linewidth=1)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def render(paths, figure=None):
    """--render: the protocol table of the records in `paths`, one per setting of the example's arguments,
    each headed by its command's settings, the machine and the dates; with `figure`, the first setting drawn."""
    records = quality_run.plot.load(paths)
    settings = {}
    for record in records:
        settings.setdefault(tuple(record["example_args"]), {}).setdefault(record["mode"], []).append(record)
    blocks = []
    for n, (example_args, by_mode) in enumerate(settings.items()):
        every = [r for rs in by_mode.values() for r in rs]
        dates = sorted(r["date"] for r in every)
        machines = sorted({r["machine"].get("note", "") for r in every})
        blocks.append(f"Arguments of every run: `{' '.join(example_args)}`; {len(every)} runs, {dates[0]} to "
                      f"{dates[-1]}, backend {every[0]['keras_backend']}, {every[0]['num_test_examples']} test "
                      f"reviews; machine: {'; '.join(machines)}\n\n" + protocol_table(by_mode))
        if figure and n == 0:
            protocol_plot(by_mode, figure, title=f"{every[0]['pretrained']} fine-tuned under the protocol")
    return "\n\n".join(blocks)


BLOCK = re.compile(r"<!-- convert-protocol-table: (.+?) -->\n((?:(?!<!-- /convert-protocol-table -->).*\n)*)"
                   r"<!-- /convert-protocol-table -->")


def published_blocks(text):
    """{record files (as the marker names them, space-separated): the Markdown between the markers} of a page."""
    return {match.group(1): match.group(2).rstrip("\n") for match in BLOCK.finditer(text)}


def write_block(page, paths, markdown):
    """Replaces the block `<!-- convert-protocol-table: PATHS -->` ... `<!-- /convert-protocol-table -->` of the
    file `page` by `markdown`; ValueError naming the marker when the page has no such block."""
    key = " ".join(paths)
    with open(page, encoding="utf-8") as f:
        text = f.read()
    if key not in published_blocks(text):
        raise ValueError(f"--write: {page} has no block <!-- convert-protocol-table: {key} --> ... "
                         f"<!-- /convert-protocol-table --> to replace (add the two markers where the table goes)")
    text = BLOCK.sub(lambda match: match.group(0) if match.group(1) != key else
                     f"<!-- convert-protocol-table: {key} -->\n{markdown}\n<!-- /convert-protocol-table -->", text)
    with open(page, "w", encoding="utf-8") as f:
        f.write(text)


def fidelity(args):
    """examples/convert_pretrained.py --fidelity: the converted models before any fine-tuning."""
    command = [sys.executable, EXAMPLE, "--pretrained", args.pretrained, "--fidelity", str(args.fidelity)]
    subprocess.run(command + (["--data-dir", args.data_dir] if args.data_dir else []), check=True,
                   cwd=os.path.dirname(EXAMPLE))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    full_argv = list(argv)
    example_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", default=None, help="Hugging Face BERT checkpoint folder (required to train)")
    parser.add_argument("--data-dir", default=None, help="IMDB folder; default: the built-in long-range task")
    parser.add_argument("--learning-rates", type=float, nargs="+", default=[5e-5, 2e-4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", help="folder of the runs, results.json and the figure")
    parser.add_argument("--protocol", action="store_true",
                        help="each mode under the quality protocol (see above) instead of every rate and seed")
    parser.add_argument("--extend-factor", type=float, default=protocol.EXTEND_FACTOR,
                        help="--protocol: the ratio of an extension to the edge rate. Default: %(default)s")
    parser.add_argument("--max-extensions", type=int, default=protocol.MAX_EXTENSIONS,
                        help="--protocol: extensions at most. Default: %(default)s")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="--protocol: a JSON list (docs/data/...) to append each run's record to, and to resume from")
    parser.add_argument("--machine-note", default=None,
                        help="--record: what else ran on the machine, recorded with every run ('quiet' if nothing)")
    parser.add_argument("--render", nargs="+", default=None, metavar="FILE",
                        help="instead of training: the protocol table of the records in these files")
    parser.add_argument("--figure", default=None, help="--render: a PNG to draw the first setting's records in")
    parser.add_argument("--write", default=None, metavar="PAGE",
                        help="--render: put the table in PAGE, between <!-- convert-protocol-table: FILE... --> (the "
                             "files as given to --render) and <!-- /convert-protocol-table -->")
    parser.add_argument("--fidelity", type=int, default=None, metavar="N",
                        help="instead of training: the converted models' embeddings against softmax's on N texts")
    args = parser.parse_args(argv)
    if args.write and not args.render:
        parser.error("--write needs --render (it publishes the rendered table)")
    if args.render:
        markdown = render(args.render, args.figure)
        print(markdown)
        if args.write:
            try:
                write_block(args.write, args.render, markdown)
            except (OSError, ValueError) as error:
                parser.error(str(error))
            print(f"wrote the table into {args.write}")
        return None
    if not args.pretrained:
        parser.error("--pretrained is required (the checkpoint folder)")
    if args.record and not args.protocol:
        parser.error("--record needs --protocol (it records protocol runs)")
    if args.record and not args.machine_note:
        parser.error("--record needs --machine-note: what else ran on the machine ('quiet' if nothing)")
    args.argv = full_argv
    # Each run's process starts in examples/: the paths it is given are made absolute here.
    args.pretrained = os.path.abspath(args.pretrained)
    args.data_dir = args.data_dir and os.path.abspath(args.data_dir)
    if args.fidelity:
        return fidelity(args)
    if not args.out:
        parser.error("--out is required (the folder of the runs)")
    args.example_args = example_args
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.protocol:
        return run_protocols(args)
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
