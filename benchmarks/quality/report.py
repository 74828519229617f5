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

The protocol's tables (`render_protocol`) come from the records of benchmarks/quality/protocol.py
(docs/data/quality_protocol_*.json), one per cell: per attention the seed-0 validation score
(accuracy; bits per byte for lm: plot.metric) at every rate tried (a failed run's after the word
"failed"), the rate chosen on it and whether it is interior, the test score's mean [min, max] over the
seeds at that rate that did not fail, and the failed runs by name (protocol.summarize derives each row;
run.judge judged each run when it ran), above them the commands, machine and dates;
with --plot FOLDER each cell's figure too (plot.plot_protocol: FOLDER/quality_protocol_<cell>.png).

    python benchmarks/quality/report.py [docs/data/quality_*.json ...]     # prints every table
    python benchmarks/quality/report.py --protocol [--plot FOLDER] [docs/data/quality_protocol_*.json ...]
        # and, where YOSO ran at several (m, tau) in a cell, that cell's sweep table (render_sweep)
    python benchmarks/quality/report.py --state [--plot PNG]     # the equal-state tables (issue 43, item 4)
    python benchmarks/quality/report.py --write docs/quality.md   # every table of the page, in place

The equal-state tables (`render_state`) come from the protocol records of docs/data/quality_state_*.json
(the same cell with the attentions' state widened or narrowed: YOSO's m and tau, the fixed-state models'
feature sizes) together with that cell's configurations in docs/data/quality_protocol_*.json (the
library defaults): per configuration its state bytes, the protocol's row and whether it is on the
frontier (no other configuration reaches a higher mean test accuracy with at most its state).

docs/quality.md holds each table between `<!-- quality-table: KEY -->` (protocol tables:
`<!-- quality-protocol-table: KEY -->`, and so on) and `<!-- /quality-table -->`; `--write` replaces every
block of the page with what the records give and names the cells whose block the page lacks (figures:
--protocol --plot and --state --plot). tests/test_quality_records.py fails when a published table
differs from what this renders.
"""

import glob
import importlib.util
import math
import os
import re
import shlex
import sys


def _module(name):
    """A module beside this file (benchmarks/ is not a package: loaded by path under a private name)."""
    spec = importlib.util.spec_from_file_location(f"quality_{name}", os.path.join(os.path.dirname(__file__),
                                                                                   f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plot = _module("plot")
protocol = _module("protocol")

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "data")
DEFAULT_FILES = ("quality_mqar_2026-11-25.json", "quality_2026-11-26.json")
PROTOCOL_FILES = "quality_protocol_*.json"
STATE_FILES = "quality_state_*.json"


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


def _provenance(cell):
    """The lines above a protocol table: dates, the machines (each one the runs ran on) and their load, backend,
    commands."""
    dates = sorted(r["date"] for r in cell)
    machines = []  # every machine the cell's runs ran on, in the order of their first run
    for record in sorted(cell, key=lambda r: r["date"]):
        machine = f"{record['machine']['cpu_model'] or record['machine']['processor']} " \
                  f"({record['machine']['cpu_count']} CPUs)"
        if machine not in machines:
            machines.append(machine)
    notes = sorted({r["protocol"]["machine_note"] for r in cell})
    if len(notes) > 1:  # one per command: each command below carries its --machine-note
        quiet = {r["protocol"]["machine_quiet"] for r in cell}
        notes = [f"{'quiet' if quiet == {True} else 'not quiet' if quiet == {False} else 'quiet for some'} "
                 f"({len(notes)} notes: each command's --machine-note below)"]
    commands = []
    for record in cell:
        command = shlex.join(record["command"])
        if command not in commands:
            commands.append(command)
    first = cell[0]
    return [f"Runs {dates[0]} to {dates[-1]} (UTC), Keras {first['keras_backend']} {first['backend_version']}, "
            f"{' and '.join(machines)}; the machine: "
            f"{'; '.join(notes)}. Grid {', '.join(f'{lr:g}' for lr in first['protocol']['grid'])}, "
            f"extended by x{first['protocol']['extend_factor']:g} at most {first['protocol']['max_extensions']} times; "
            f"{first['validation_size']:,} validation and {first['test_size']:,} test "
            f"{'sequences' if first['task'] == 'mqar' else 'examples'}. Commands:", ""]\
        + [f"    python {command}" for command in commands] + [""]


def _cell_configurations(records, key, order, what):
    """[(runs, protocol.summarize row)] of cell `key`, one per configuration (`configurations`), sorted by
    `order`(runs, row); KeyError naming `what` records when the cell has none."""
    configs = configurations(r for r in records if cell_key(r) == key)
    if not configs:
        raise KeyError(f"no {what} record of the cell {key!r}")
    return sorted(((runs, protocol.summarize(runs)) for runs in configs.values()), key=lambda item: order(*item))


def _table_order(runs, row):
    """A protocol table's order: best mean test score first (highest accuracy, lowest bits per byte), those
    without one after them, the floor last."""
    mean = row["test_mean"] or 0
    return runs[0]["status"] == "floor", row["test_mean"] is None, -mean if row["higher_is_better"] else mean


def protocol_title(rows):
    """The figure title of a protocol cell, from its [(first record, protocol.summarize row)]: task, sizes
    (MQAR: length, pairs and vocabulary, which differs between cells), steps and batch."""
    first = rows[0][0]
    what = (f"MQAR, {first['length']} tokens, {first['pairs']} pairs, vocabulary {first['vocab']:,}"
            if first["task"] == "mqar" else
            f"byte-level LM on IMDB text, {first['length']} bytes" if first["task"] == "lm" else
            f"{first['task']}, {first['length']} tokens")
    return (f"{what}, {first['steps']} steps, batch {first['batch_size']}\n"
            "the protocol: rate chosen on validation, 3 seeds at it")


def render_protocol(records, key, configs=None):
    """The protocol table of cell `key` (cell_key) with its provenance lines above it; `configs`: the cell's
    [(runs, protocol.summarize row)] in the table's order, when the caller has them already."""
    cell = [r for r in records if cell_key(r) == key]
    configs = configs or _cell_configurations(records, key, _table_order, "protocol")
    lrs = sorted({r["lr"] for r in cell})
    _, _, metric, _ = plot.metric(cell[0]["task"])
    lines = _provenance(cell) + [
        "| attention | state bytes / layer | " + " | ".join(f"validation {metric}, lr {lr:g}" for lr in lrs)
        + f" | chosen lr | interior | test {metric} mean [min, max] (seeds kept of run) | failed runs |",
        "| --- | ---: | " + " | ".join("---:" for _ in lrs) + " | ---: | --- | ---: | --- |"]
    for runs, row in configs:
        first = runs[0]
        seed0 = {r["lr"]: r for r in runs if r["seed"] == protocol.SEEDS[0]}
        scores = ["—" if lr not in seed0 else protocol.seed0_cell(seed0[lr]) for lr in lrs]
        chosen, interior, result = protocol.outcome(row)
        settings = first.get("settings") or "-"
        label = first["attention"] + (f" ({settings})" if settings != "-" else "") \
            + (" (the floor)" if first["status"] == "floor" else "")
        state = first.get("state_bytes_per_layer")
        lines.append(f"| {label} | {'—' if state is None else f'{state:,}'} | " + " | ".join(scores)
                     + f" | {chosen} | {interior} | {result} | "
                     + ("; ".join(protocol.failed_run(r) for r in row["failed"]) or "none") + " |")
    return "\n".join(lines)


def configurations(records):
    """{plot.config_key: its records}; a run recorded twice (same configuration, rate and seed: the floor,
    which each protocol invocation that starts a records file trains first) counts once."""
    configs, seen = {}, set()
    for record in records:
        config = plot.config_key(record)
        if (config, record["lr"], record["seed"]) not in seen:
            seen.add((config, record["lr"], record["seed"]))
            configs.setdefault(config, []).append(record)
    return configs


def state_configurations(records, key):
    """[(first record, protocol row)] of cell `key`, one per configuration (`configurations`), the floor
    last and the others by attention and state bytes."""
    def order(runs, row):
        return runs[0]["status"] == "floor", runs[0]["attention"], runs[0].get("state_bytes_per_layer") or 0

    return [(runs[0], row) for runs, row in _cell_configurations(records, key, order, "equal-state")]


def frontier(rows):
    """The configurations of `rows` (state_configurations) on the accuracy-state frontier, as a set of
    plot.config_key: a complete protocol row with a mean test accuracy that no other complete row reaches
    or beats at no more state (the floor, with no state, is not a configuration of an attention)."""
    done = [(first["state_bytes_per_layer"], row["test_mean"], plot.config_key(first)) for first, row in rows
            if first["status"] != "floor" and row["complete"] and row["test_mean"] is not None]
    return {key for state, mean, key in done
            if not any(other_key != key and other_state <= state and other_mean >= mean
                       and (other_state, -other_mean) < (state, -mean) for other_state, other_mean, other_key in done)}


def render_state(records, key):
    """The equal-state table of cell `key` with its provenance lines above it: per configuration the state
    bytes of one layer's causal decoding state, the protocol's chosen rate, whether it is interior, the test
    accuracy over the seeds kept there, the failed runs, and whether it is on the frontier."""
    rows = state_configurations(records, key)
    on_frontier = frontier(rows)
    cell = [r for r in records if cell_key(r) == key]
    lines = _provenance(cell) + [
        "| attention | settings | state bytes / layer | chosen lr | interior | "
        "test accuracy mean [min, max] (seeds kept of run) | failed runs | on the frontier |",
        "| --- | --- | ---: | ---: | --- | ---: | --- | --- |"]
    for first, row in rows:
        chosen, interior, result = protocol.outcome(row)
        state = first.get("state_bytes_per_layer")
        name = first["attention"] + (" (the floor)" if first["status"] == "floor" else "")
        lines.append(f"| {name} | {first.get('settings') or '-'} | {'—' if state is None else f'{state:,}'} | "
                     f"{chosen} | {interior} | {result} | "
                     + ("; ".join(protocol.failed_run(r) for r in row["failed"]) or "none") + " | "
                     + ("yes" if plot.config_key(first) in on_frontier
                        else "—" if first["status"] == "floor" else "no") + " |")
    return "\n".join(lines)


def _yoso_settings(records, key):
    """{(tau, m): (first record, protocol row)} of YOSO's settings (without a convolution) in cell `key`."""
    rows = [(first, row) for first, row in state_configurations(records, key)
            if first["attention"] == "yoso" and not first["attention_kwargs"].get("conv_window")]
    return {(first["attention_kwargs"]["hash_code_len"], first["attention_kwargs"]["num_hashes"]): (first, row)
            for first, row in rows}


def sweep_cells(records):
    """The cells of `records` where YOSO ran at more than one (m, tau): those with a sweep table."""
    return sorted(key for key in {cell_key(r) for r in records} if len(_yoso_settings(records, key)) > 1)


def render_sweep(records, key):
    """YOSO's settings of cell `key` (equal-state or protocol records) as a grid (issue 43, item 5): a row per
    hash_code_len tau, a column per num_hashes m, each cell the protocol's test accuracy mean [min, max]
    over its seeds at the chosen rate (the rate after it; "k of 3 seeds" where a seed failed there),
    "failed" when every rate or seed failed, "—" when the protocol did not finish or did not run; below
    it the settings ranked by the seeds kept, then the mean, then the worst seed."""
    grid = {setting: row for setting, (_, row) in _yoso_settings(records, key).items()}
    taus = sorted({tau for tau, _ in grid})
    ms = sorted({m for _, m in grid})

    def cell(row):
        if row is None or not row["complete"]:
            return "—"
        if row["test_mean"] is None:
            return "failed"
        return (f"{row['test_mean']:.3f} [{row['test_min']:.3f}, {row['test_max']:.3f}] at {row['chosen_lr']:g}"
                + ("" if row["interior"] else " (edge)") + _seeds_lost(row))

    lines = ["| tau (rows), m (columns) | " + " | ".join(f"m = {m}" for m in ms) + " |",
             "| --- | " + " | ".join("---:" for _ in ms) + " |"]
    lines += [f"| tau = {tau} | " + " | ".join(cell(grid.get((tau, m))) for m in ms) + " |" for tau in taus]
    ranked = sorted(((row["seeds_kept"], row["test_mean"], row["test_min"], tau, m) for (tau, m), row in grid.items()
                     if row["complete"] and row["test_mean"] is not None), reverse=True)
    lines += ["", "Ranked by seeds kept, then mean test accuracy (worst seed after it): " + "; ".join(
        f"{i}. m = {m}, tau = {tau}: {mean:.3f} ({low:.3f}){_seeds_lost(grid[tau, m])}"
        for i, (_, mean, low, tau, m) in enumerate(ranked, 1)) + "."]
    return "\n".join(lines)


def _seeds_lost(row):
    """", k of n seeds" when a seed failed at the chosen rate, else ""."""
    return "" if row["seeds_kept"] == row["seeds_run"] else f", {row['seeds_kept']} of {row['seeds_run']} seeds"


def load_state(paths=None):
    """The equal-state records (docs/data/quality_state_*.json by default) and, of the protocol records
    (docs/data/quality_protocol_*.json), those of the same cells: the library defaults' rows."""
    records = plot.load(paths or sorted(glob.glob(os.path.join(DATA, STATE_FILES))))
    cells = {cell_key(r) for r in records}
    return records + [r for r in load_protocol() if cell_key(r) in cells]


def load(paths=None):
    paths = paths or [os.path.join(DATA, name) for name in DEFAULT_FILES]
    return plot.load(paths)


def load_protocol(paths=None):
    return plot.load(paths or sorted(glob.glob(os.path.join(DATA, PROTOCOL_FILES))))


BLOCK = re.compile(r"<!-- quality-(table|protocol-table|sweep-table|state-table): (.+?) -->\n"
                   r"((?:(?!<!-- /quality-table -->).*\n)*)<!-- /quality-table -->")


def block(kind, key, markdown):
    """A table as the page holds it: `<!-- quality-KIND: KEY -->`, the Markdown, `<!-- /quality-table -->`."""
    return f"<!-- quality-{kind}: {key} -->\n{markdown}\n<!-- /quality-table -->"


def page_blocks(text, kind):
    """[(key, Markdown)] of the page's blocks of `kind` ("table", "protocol-table", ...), in page order."""
    return [(match.group(2), match.group(3)[:-1]) for match in BLOCK.finditer(text) if match.group(1) == kind]


def table_cells(records):
    """Per cell of the records from before the protocol (load), in key order: (key, [("table", Markdown)])."""
    for key in sorted({cell_key(r) for r in records}):
        yield key, [("table", render(records, key))]


def protocol_cells(records):
    """Per cell of the protocol records (load_protocol), in key order: (key, its configurations, [(kind,
    Markdown)]): the protocol table, and the sweep table where YOSO ran at several (m, tau). The
    configurations are summarized once, for the table and the cell's figure."""
    sweeps = sweep_cells(records)
    for key in sorted({cell_key(r) for r in records}):
        configs = _cell_configurations(records, key, _table_order, "protocol")
        blocks = [("protocol-table", render_protocol(records, key, configs))]
        if key in sweeps:
            blocks.append(("sweep-table", render_sweep(records, key)))
        yield key, configs, blocks


def state_cells(records):
    """Per equal-state cell (load_state), in key order: (key, [("state-table", ...), ("sweep-table", ...)])."""
    for key in sorted({cell_key(r) for r in records}):
        yield key, [("state-table", render_state(records, key)), ("sweep-table", render_sweep(records, key))]


def rendered_blocks():
    """{(kind, cell key): Markdown} of every table the records in docs/data give: "table" (load: the tables
    from before the protocol), "protocol-table" and "sweep-table" (protocol_cells) and "state-table" with its
    "sweep-table" (state_cells, which renders an equal-state cell's sweep from the state records too)."""
    cells = [*table_cells(load()), *((key, blocks) for key, _, blocks in protocol_cells(load_protocol())),
             *state_cells(load_state())]
    return {(kind, key): markdown for key, blocks in cells for kind, markdown in blocks}


def write_page(text, blocks):
    """(`text` with each of its blocks -- `<!-- quality-KIND: KEY -->` to `<!-- /quality-table -->` -- replaced
    by `blocks`[KIND, KEY] (rendered_blocks), the (kind, key) of the blocks it does not hold). ValueError
    naming the block when the page holds one that no record gives."""
    on_page = set()

    def replace(match):
        kind, key = match.group(1), match.group(2)
        if (kind, key) not in blocks:
            raise ValueError(f"the page's block <!-- quality-{kind}: {key} --> has no records in docs/data: "
                             f"remove it, or add the records of the cell {key!r}")
        on_page.add((kind, key))
        return block(kind, key, blocks[kind, key])

    text = BLOCK.sub(replace, text)
    return text, sorted(set(blocks) - on_page)


def _print_blocks(key, blocks):
    """Print a cell's [(kind, Markdown)] as the page holds them, a blank line after each."""
    for kind, markdown in blocks:
        print(block(kind, key, markdown) + "\n")


def _plot_option(argv):
    """(argv without "--plot PATH", PATH or None)."""
    if "--plot" not in argv:
        return argv, None
    at = argv.index("--plot")
    if at + 1 == len(argv):
        raise SystemExit("--plot needs a path")
    return argv[:at] + argv[at + 2:], argv[at + 1]


OPTIONS = ("--write", "--protocol", "--state", "--plot")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return
    unknown = [arg for arg in argv if arg.startswith("-") and arg not in OPTIONS]
    if unknown:
        raise SystemExit(f"unknown option {unknown[0]!r}: the options are {', '.join(OPTIONS)} (--help says more)")
    if argv[:1] == ["--write"]:
        if len(argv) != 2:
            raise SystemExit(f"--write takes one page (docs/quality.md), got {argv[1:]}")
        try:
            with open(argv[1], encoding="utf-8") as f:
                old = f.read()
        except OSError as error:
            raise SystemExit(f"--write: cannot read the page {argv[1]!r} ({error.strerror}); give docs/quality.md")
        try:
            new, missing = write_page(old, rendered_blocks())
        except ValueError as error:
            raise SystemExit(f"{argv[1]}: {error}")
        if new != old:
            with open(argv[1], "w", encoding="utf-8") as f:
                f.write(new)
        print(f"{argv[1]}: " + ("rewrote its tables from docs/data" if new != old else
                                "its tables are what docs/data gives"))
        for kind, key in missing:
            print(f"  records with no block on the page (<!-- quality-{kind}: {key} -->)")
        return
    if argv[:1] == ["--protocol"]:
        argv, folder = _plot_option(argv[1:])
        for key, configs, blocks in protocol_cells(load_protocol(argv or None)):
            _print_blocks(key, blocks)
            if folder:
                rows = [(runs[0], row) for runs, row in configs]
                path = os.path.join(folder, f"quality_protocol_{key.replace(' ', '_')}.png")
                print(f"wrote {plot.plot_protocol(rows, protocol_title(rows), path)}")
        return
    if argv[:1] == ["--state"]:
        argv, png = _plot_option(argv[1:])
        records = load_state(argv or None)
        keys = []
        for key, blocks in state_cells(records):
            keys.append(key)
            _print_blocks(key, blocks)
        if png:
            print(f"wrote {plot.plot_state({key: state_configurations(records, key) for key in keys}, png)}")
        return
    for key, blocks in table_cells(load(argv or None)):
        _print_blocks(key, blocks)


if __name__ == "__main__":
    main()
