"""Renders docs/quality.md's result tables from the records in docs/data (issue 43, item 1: every
number from a record). One table per cell (task, length, pairs, steps): per configuration, the
seed-0 score at each learning rate tried, the rate the protocol chose (`plot.best_lr`) with the
mean [min, max] over its seeds that did not fail (a failed run is never averaged in), and what the
protocol says of it:

- "diverged": the final loss is not finite (a failed run, never an accuracy);
- "learned nothing": the final loss is within 1% of the uniform guess over the answers (MQAR: the
  values, ln(vocab / 2); classification: ln 2), whatever its accuracy;
- "1 seed": fewer than 3 seeds at the chosen rate;
- "edge": the chosen rate is the lowest or highest of the grid (not bracketed);
Every table of these records chose its rate on the test split (no validation split was recorded),
which the protocol forbids; docs/quality.md says so above them.

    python benchmarks/quality/report.py [docs/data/quality_*.json ...]     # prints every table

docs/quality.md holds each table between `<!-- quality-table: KEY -->` and `<!-- /quality-table -->`;
tests/test_quality_records.py fails when a published table differs from what this renders.
"""

import importlib.util
import math
import os
import sys


def _plot_module():
    """plot.py beside this file (benchmarks/ is not a package: loaded by path, sys.path untouched)."""
    spec = importlib.util.spec_from_file_location("quality_plot", os.path.join(os.path.dirname(__file__), "plot.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot = _plot_module()

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "data")
DEFAULT_FILES = ("quality_mqar_2026-11-25.json", "quality_2026-11-26.json")


def uniform_loss(record):
    """The loss of a uniform guess over the task's answers."""
    if record["task"] == "mqar":
        return math.log(record["vocab"] // 2)
    if record["task"] in plot.CLASSIFICATION:
        return math.log(2)
    return None


def failure(record):
    """"diverged", "learned nothing" or None for one run."""
    loss = record.get("loss")
    if loss is None or not math.isfinite(loss):
        return "diverged"
    guess = uniform_loss(record)
    if guess is not None and loss >= 0.99 * guess:
        return "learned nothing"
    return None


def cell_key(record):
    """The table a record belongs to, e.g. "mqar 64 4 400" or "tags 512 300"."""
    parts = [record["task"], record.get("length"), record.get("pairs"), record["steps"]]
    return " ".join(str(p) for p in parts if p is not None)


def _value(record):
    return record["bits_per_byte"] if record["task"] == "lm" else record["accuracy"]


def _format(value, metric):
    return f"{value:.3f}"


def render(records, key):
    """The Markdown table of cell `key`."""
    cell = [r for r in records if cell_key(r) == key]
    if not cell:
        raise KeyError(f"no record of the cell {key!r}")
    lrs = sorted({r["lr"] for r in cell})
    summaries = sorted(plot.best_lr(cell), key=lambda s: -plot.score({**s["record"], s["metric"]: s["mean"]}))
    metric = summaries[0]["metric"]
    lines = [f"| attention | state bytes / layer | " + " | ".join(f"lr {lr:g} (seed 0)" for lr in lrs)
             + f" | chosen lr: {metric.replace('_', ' ')} mean [min, max] (seeds) | protocol |",
             "| --- | ---: | " + " | ".join("---:" for _ in lrs) + " | ---: | --- |"]
    for summary in summaries:
        first = summary["record"]
        runs = [r for r in cell if plot.config_key(r) == plot.config_key(first)]
        by_lr = {r["lr"]: r for r in runs if r["seed"] == 0}
        scores = []
        for lr in lrs:
            run = by_lr.get(lr)
            scores.append("—" if run is None else (failure(run) or _format(_value(run), metric)))
        chosen = [r for r in runs if r["lr"] == summary["lr"]]
        failed = [(r, failure(r)) for r in chosen if failure(r)]
        kept = [_value(r) for r in chosen if not failure(r)]
        notes = [f"{len(failed)} of {len(chosen)} seeds {why}" for why in sorted({w for _, w in failed})]
        notes += ["1 seed"] if summary["seeds"] < 3 else []
        grid = sorted({r["lr"] for r in runs})
        if len(grid) > 1 and summary["lr"] in (grid[0], grid[-1]):
            notes.append("edge")
        state = first.get("state_bytes_per_layer")
        if kept:
            result = (f"{summary['lr']:g}: {_format(sum(kept) / len(kept), metric)} [{_format(min(kept), metric)}, "
                      f"{_format(max(kept), metric)}] ({len(kept)})")
        else:
            result = f"{summary['lr']:g}: failed"
        lines.append(f"| {first['label']} | {'—' if state is None else f'{state:,}'} | " + " | ".join(scores)
                     + f" | {result} | {', '.join(notes) or 'ok'} |")
    return "\n".join(lines)


def load(paths=None):
    paths = paths or [os.path.join(DATA, name) for name in DEFAULT_FILES]
    return plot.load(paths)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    records = load(argv or None)
    for key in sorted({cell_key(r) for r in records}):
        print(f"<!-- quality-table: {key} -->\n{render(records, key)}\n<!-- /quality-table -->\n")


if __name__ == "__main__":
    main()
