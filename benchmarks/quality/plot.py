"""Figures and summaries of quality-benchmark results (results.json files written by run.py).

    python benchmarks/quality/plot.py runs/quality/mqar/results.json [more.json ...] [--out DIR]

draws, per task found in the files:
  mqar   accuracy vs state bytes per layer (log x), one panel per (length, pairs), one marker and
         colour per attention label, Zoology Figure 2 style: each point is a configuration at its best
         learning rate (mean over seeds, bars from the worst to the best seed); points of the same label
         at different state sizes (e.g. widths, hashes) are joined.
  listops / imdb / tags   bars of test accuracy per attention label (best learning rate, mean over
         seeds, min-max bars), one panel per task.
  lm     bars of test bits per byte (lower is better).
Each figure goes to <out>/<task>.png (out: the folder of the first results file by default).
"""

import argparse
import json
import os
import statistics

# The fields that define one configuration; runs that differ only in lr and seed share it.
CONFIG_KEYS = ("task", "label", "attention", "attention_kwargs", "length", "pairs", "vocab", "width", "layers",
               "heads", "ffn_dim", "short_conv", "dropout", "steps", "batch_size", "train_size", "test_size", "keras_backend")
CLASSIFICATION = ("listops", "imdb", "tags")


def metric(task):
    """(test field, validation field, name, higher is better) of the score of `task`'s records: accuracy,
    or bits per byte for lm (lower is better)."""
    if task == "lm":
        return "bits_per_byte", "validation_bits_per_byte", "bits per byte", False
    return "accuracy", "validation_accuracy", "accuracy", True


def score(record, split="test"):
    """The number a learning rate is chosen by, higher is better, on `split` ("test" or "validation"):
    accuracy, or -bits per byte (lm)."""
    test, validation, _, higher = metric(record["task"])
    value = record[test if split == "test" else validation]
    return value if higher else -value


def load(paths):
    """All records of the results.json files in `paths` (each a JSON list)."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            records += json.load(f)
    return records


def config_key(record):
    return json.dumps([record.get(key) for key in CONFIG_KEYS], sort_keys=True, default=str)


def best_lr(records):
    """[summary per configuration]: the learning rate the protocol chose, with that lr's mean, min, max
    and count of the metric, and the configuration's first record. The protocol trains seed 0 at every
    rate, then more seeds at the best: the rate with the most seeds; among rates with as many seeds
    (one sweep), the best mean score. (The best mean alone would prefer one lucky seed at another
    rate to the three seeds of the chosen one.)"""
    configs = {}
    for record in records:
        configs.setdefault(config_key(record), {}).setdefault(record["lr"], []).append(record)
    summaries = []
    for by_lr in configs.values():
        lr, runs = max(by_lr.items(), key=lambda item: (len(item[1]), statistics.mean(score(r) for r in item[1])))
        field = metric(runs[0]["task"])[0]
        values = [r[field] for r in runs]
        summaries.append({"record": runs[0], "lr": lr, "metric": field, "mean": statistics.mean(values),
                          "min": min(values), "max": max(values), "seeds": len(values),
                          "lrs": sorted(by_lr)})
    return summaries


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


MARKERS = "osD^v<>PX*hp"
# Published, not measured here: Zoology (Arora et al. 2023), Figure 2 (vocabulary 8,192, widths 64-512,
# 2 layers, their longer training), the ranges as issue 28 quotes them. Drawn as grey areas in every
# MQAR panel: (label, state bytes range or None for every state size, accuracy range).
PUBLISHED = (("published: attention, Zoology Fig. 2", None, (0.97, 0.98)),
             ("published: gated / delta recurrent models, Zoology Fig. 2", (3.4e4, 1.6e5), (0.95, 0.99)))


def _draw_published(ax):
    """PUBLISHED's ranges on `ax`, grey, each labelled as published."""
    for (label, state, (low, high)), hatch in zip(PUBLISHED, ("", "//")):
        if state is None:
            ax.axhspan(low, high, color="grey", alpha=0.3, label=label)
        else:
            ax.fill_between(state, low, high, facecolor="none", edgecolor="grey", hatch=hatch, label=label)


def _save(plt, fig, axes, path, legend_from):
    """The first panel's legend right of x = legend_from (a fraction of the figure), then `path` (PNG; its
    folder made if missing)."""
    handles, names = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, legend_from, 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_mqar(records, path):
    """Accuracy vs state bytes per layer (log x), one panel per (length, pairs)."""
    plt = _pyplot()
    summaries = best_lr([r for r in records if r["task"] == "mqar"])
    panels = sorted({(s["record"]["length"], s["record"]["pairs"]) for s in summaries})
    labels = sorted({s["record"]["label"] for s in summaries})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels) + 1.5, 4), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, (length, pairs) in zip(axes[0], panels):
        for i, label in enumerate(labels):
            points = sorted([(s["record"]["state_bytes_per_layer"], s) for s in summaries
                             if s["record"]["label"] == label and (s["record"]["length"], s["record"]["pairs"]) ==
                             (length, pairs) and s["record"]["state_bytes_per_layer"]], key=lambda point: point[0])
            if not points:
                continue
            x = [p[0] for p in points]
            y = [p[1]["mean"] for p in points]
            err = [[p[1]["mean"] - p[1]["min"] for p in points], [p[1]["max"] - p[1]["mean"] for p in points]]
            ax.errorbar(x, y, yerr=err, marker=MARKERS[i % len(MARKERS)], color=colors(i % 10), label=label,
                        capsize=3, linestyle="-" if len(points) > 1 else "none", markersize=7)
        ax.set_xscale("log")
        _draw_published(ax)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("state bytes per layer (causal decoding, one sequence)")
        ax.set_ylabel("MQAR accuracy (query positions)")
        ax.set_title(f"MQAR, length {length}, {pairs} pairs")
        ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, axes, path, legend_from=0.8)


def plot_state(cells, path):
    """Accuracy against state bytes per layer (log x) of the equal-state tables (report.render_state), one
    panel per cell: per attention every configuration (the protocol's test mean over the seeds kept at its
    chosen rate, bars from the worst to the best of them; a hollow marker where a seed failed there), the
    best of them at each state size joined by a line (several YOSO settings share a state size: m 2^tau);
    the model with no attention as a dotted line; configurations whose protocol failed or did not finish left out (the table
    names them); Zoology's published ranges (PUBLISHED) in grey, marked as published.

    cells: {cell key: [(first record, protocol.summarize row)]}."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(cells), figsize=(6.5 * len(cells) + 2, 4.5), squeeze=False)
    colors = plt.get_cmap("tab10")
    names = sorted({first["attention"] for rows in cells.values() for first, _ in rows if first["status"] != "floor"})
    for ax, (key, rows) in zip(axes[0], sorted(cells.items())):
        for i, name in enumerate(names):
            points = sorted(((first["state_bytes_per_layer"], row) for first, row in rows
                             if first["attention"] == name and first["status"] != "floor" and row["complete"]
                             and row["test_mean"] is not None), key=lambda point: point[0])
            if not points:
                continue
            for every_seed in (True, False):  # hollow where a seed failed at the chosen rate
                group = [(state, row) for state, row in points if (row["seeds_kept"] == row["seeds_run"]) == every_seed]
                if not group:
                    continue
                ax.errorbar([state for state, _ in group], [row["test_mean"] for _, row in group],
                            yerr=[[row["test_mean"] - row["test_min"] for _, row in group],
                                  [row["test_max"] - row["test_mean"] for _, row in group]],
                            marker=MARKERS[i % len(MARKERS)], color=colors(i % 10), capsize=3, linestyle="none",
                            markersize=6, alpha=0.8, markerfacecolor=None if every_seed else "none",
                            label=name if every_seed or len(group) == len(points) else None)
            best = {}
            for state, row in points:
                best[state] = max(best.get(state, 0.0), row["test_mean"])
            if len(best) > 1:
                ax.plot(sorted(best), [best[state] for state in sorted(best)], color=colors(i % 10), linewidth=1.2)
        floor = [row["test_mean"] for first, row in rows if first["status"] == "floor" and row["test_mean"] is not None]
        if floor:
            ax.axhline(floor[0], color="black", linestyle=":", label="no attention (the floor)")
        _draw_published(ax)
        ax.set_xscale("log")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("state bytes per layer (causal decoding, one sequence)")
        ax.set_ylabel("test accuracy, mean [min, max] over the seeds kept\n(hollow: a seed failed at the chosen rate)")
        first = rows[0][0]
        ax.set_title(f"MQAR, {first['length']} tokens, {first['pairs']} pairs, {first['steps']} steps"
                     if first["task"] == "mqar" else f"{key} steps")
        ax.grid(True, which="both", alpha=0.3)
    return _save(plt, fig, axes, path, legend_from=0.72)


def plot_protocol(rows, title, path):
    """The protocol table of one cell (report.render_protocol) as bars: per configuration, in the table's
    order, the test score's mean over the seeds kept at the chosen rate with error bars from the worst to
    the best of them, annotated with the mean and the seeds kept of those run: accuracy as bars from 0,
    bits per byte (lm) as points on an axis fitted to the scores; a configuration whose every rate failed,
    or whose protocol did not finish, gets no mark and says so; the floor as a dotted line.

    rows: [(first record, protocol.summarize row)], the floor among them."""
    plt = _pyplot()
    bars = [(first, row) for first, row in rows if first["status"] != "floor"]
    fig, axes = plt.subplots(1, 1, figsize=(max(5.0, 1.2 + 0.9 * len(bars)) + 2, 4.5), squeeze=False)
    ax = axes[0][0]
    colors = plt.get_cmap("tab10")
    _, _, metric_name, higher = metric(rows[0][0]["task"])
    for i, (first, row) in enumerate(bars):
        settings = first.get("settings") or "-"
        name = first["attention"] + ("" if settings == "-" else f"\n{settings}")
        if row["complete"] and row["test_mean"] is not None:
            mean = row["test_mean"]
            spread = [[mean - row["test_min"]], [row["test_max"] - mean]]
            if higher:  # accuracy: a bar from 0
                ax.bar(i, mean, yerr=spread, capsize=3, color=colors(i % 10))
            else:  # bits per byte: the differences lie far from 0, so a point on an axis fitted to the scores
                ax.errorbar(i, mean, yerr=spread, fmt="o", capsize=4, color=colors(i % 10))
            note = f"{mean:.3f}\n{row['seeds_kept']} of {row['seeds_run']} seeds"
            ax.annotate(note, (i, row["test_max"]), ha="center", va="bottom", fontsize=7, xytext=(0, 4),
                        textcoords="offset points")
        else:
            why = "every rate failed" if row["chosen_lr"] is None else "every seed failed"
            ax.annotate(why if row["complete"] else "not finished", (i, 0.02), xycoords=("data", "axes fraction"), ha="center",
                        va="bottom", fontsize=7, rotation=90)
        ax.text(i, -0.04, name, ha="right", va="top", rotation=30, fontsize=7, transform=ax.get_xaxis_transform())
    floor = [row["test_mean"] for first, row in rows if first["status"] == "floor" and row["test_mean"] is not None]
    if floor:
        ax.axhline(floor[0], color="black", linestyle=":", label=f"no attention (the floor): {floor[0]:.3f}")
    ax.set_xticks([])
    ax.set_xlim(-0.6, len(bars) - 0.4)
    if higher:  # accuracy
        ax.set_ylim(0, 1.12)
        ax.set_ylabel(f"test {metric_name} at the rate chosen on validation,\nmean over the seeds kept [min, max]")
    else:  # the scores and the floor, with room for the notes above them
        scores = [v for _, row in rows for v in (row["test_min"], row["test_max"]) if v is not None]
        low, high = min(scores), max(scores)
        pad = max(0.05, 0.25 * (high - low))
        ax.set_ylim(low - pad, high + 2 * pad)
        ax.set_ylabel(f"test {metric_name} (lower is better),\nmean [min, max] of the seeds kept")
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    return _save(plt, fig, axes, path, legend_from=0.75)


def plot_bars(records, path, tasks):
    """Bars per attention label: test accuracy (classification) or bits per byte (lm), one panel per task."""
    plt = _pyplot()
    summaries = best_lr([r for r in records if r["task"] in tasks])
    tasks = [t for t in tasks if any(s["record"]["task"] == t for s in summaries)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(5.0, 1.0 + 0.7 * len(summaries)) * len(tasks), 4.5),
                             squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rows = sorted((s for s in summaries if s["record"]["task"] == task),
                      key=lambda s: (s["record"]["label"], s["record"]["length"]))
        names = [f"{s['record']['label']}\nL={s['record']['length']}" for s in rows]
        means = [s["mean"] for s in rows]
        err = [[s["mean"] - s["min"] for s in rows], [s["max"] - s["mean"] for s in rows]]
        bars = ax.bar(range(len(rows)), means, yerr=err, capsize=3, color=plt.get_cmap("tab20" if len(rows) > 10 else "tab10")(range(len(rows))))
        for bar, value in zip(bars, means):
            ax.annotate(f"{value:.3f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                        va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(rows)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("test bits per byte (lower is better)" if task == "lm" else "test accuracy")
        ax.set_title(task)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_task(records, task, out_dir):
    """Draws the figure of `task` from `records` into out_dir/<task>.png; its path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{task}.png")
    if task == "mqar":
        return plot_mqar(records, path)
    return plot_bars(records, path, (task,))


def summary_lines(records):
    """Text lines: per configuration, the best lr and its mean score over seeds."""
    lines = []
    for s in sorted(best_lr(records), key=lambda s: (s["record"]["task"], s["record"]["label"])):
        r = s["record"]
        extra = f" pairs={r['pairs']}" if r["task"] == "mqar" else ""
        lines.append(f"{r['task']} L={r['length']}{extra} {r['label']}: best lr {s['lr']:g} (of "
                     f"{', '.join(f'{lr:g}' for lr in s['lrs'])}): {s['metric']} mean {s['mean']:.4f} "
                     f"[{s['min']:.4f}, {s['max']:.4f}] over {s['seeds']} seed(s)")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results.json files written by run.py")
    parser.add_argument("--out", default=None, help="folder of the PNGs. Default: the first file's folder")
    args = parser.parse_args(argv)
    records = load(args.results)
    out = args.out or os.path.dirname(os.path.abspath(args.results[0]))
    for line in summary_lines(records):
        print(line)
    for task in sorted({r["task"] for r in records}):
        print(f"wrote {plot_task(records, task, out)}")


if __name__ == "__main__":
    main()
