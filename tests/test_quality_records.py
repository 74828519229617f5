"""Every published quality number follows from the records (issue 43, item 1): the tables of
docs/quality.md are what benchmarks/quality/report.py renders from docs/data, and the README's
results table quotes the same records. The protocol's tables (issue 43, item 2) are what it renders
from docs/data/quality_protocol_*.json, every cell of those records is published, and their records
hold what the protocol promises (validation chooses, 3 seeds at the chosen rate, failed runs named)."""

import importlib.util
import json
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.all_cases  # every table on every backend (cheap)


def _script(name, *path):
    """The benchmark script at REPO/`path`, loaded as module `name` (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, *path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


report = _script("quality_report", "benchmarks", "quality", "report.py")
RECORDS = report.load()
PAGE = _read("docs", "quality.md")
TABLES = report.page_blocks(PAGE, "table")
PROTOCOL_RECORDS = report.load_protocol()
PROTOCOL_TABLES = report.page_blocks(PAGE, "protocol-table")
STATE_RECORDS = report.load_state()
STATE_TABLES = report.page_blocks(PAGE, "state-table")
SWEEP_TABLES = report.page_blocks(PAGE, "sweep-table")
RENDERED = report.rendered_blocks()  # every block the records give, for report.py --write


def test_the_quality_page_publishes_its_tables_as_rendered_blocks():
    assert {key for key, _ in TABLES} >= {"mqar 64 4 400", "mqar 128 8 400", "mqar 256 16 1000", "lm 1024 500"}
    assert {key for key, _ in PROTOCOL_TABLES} >= {"mqar 32 4 250", "mqar 32 4 750", "mqar 64 4 750", "mqar 64 8 250",
                                                   "mqar 64 8 750", "mqar 128 8 1000", "mqar 256 16 1000",
                                                   "tags 512 300", "lm 1024 500"}


@pytest.mark.parametrize("key, published", TABLES, ids=[key for key, _ in TABLES])
def test_each_published_table_is_what_the_records_give(key, published):
    assert published == report.render(RECORDS, key), f"re-render with python benchmarks/quality/report.py ({key})"


def test_a_protocol_table_names_every_machine_its_runs_ran_on():
    cells = {}
    for record in PROTOCOL_RECORDS:
        cells.setdefault(report.cell_key(record), []).append(record)
    for key, cell in cells.items():
        header = report._provenance(cell)[0]
        for record in cell:
            machine = record["machine"]["cpu_model"] or record["machine"]["processor"]
            assert f"{machine} ({record['machine']['cpu_count']} CPUs)" in header, (key, header)


def _mean_range(row):
    """("mean", "[min, max]") of a protocol row's test score, as the README writes them."""
    return f"{row['test_mean']:.3f}", f"[{row['test_min']:.3f}, {row['test_max']:.3f}]"


def _protocol_yoso_and_softmax(key):
    """_mean_range of YOSO's and of softmax's protocol rows in cell `key`, each checked complete, interior and
    over 3 seeds kept."""
    cell = [r for r in PROTOCOL_RECORDS if report.cell_key(r) == key]
    rows = [report.protocol.summarize([r for r in cell if r["label"] == label]) for label in ("yoso", "softmax")]
    assert all(row["complete"] and row["interior"] and row["seeds_kept"] == 3 for row in rows), key
    return [_mean_range(row) for row in rows]


def test_the_readme_results_table_quotes_the_records():
    readme = _read("README.md")
    yoso, softmax = _protocol_yoso_and_softmax("mqar 256 16 1000")
    assert f"16 pairs, vocabulary 8,192, 1,000 steps; rate chosen on validation, 3 seeds), test accuracy, mean " \
           f"[min, max] | **{yoso[0]}** {yoso[1]} | {' '.join(softmax)} |" in readme
    yoso, softmax = _protocol_yoso_and_softmax("mqar 64 8 250")
    assert f"test accuracy, mean [min, max] | {' '.join(yoso)} | **{softmax[0]}** {softmax[1]} |" in readme
    yoso, softmax = _protocol_yoso_and_softmax("mqar 64 4 750")
    assert f"vocabulary 8,192, 750 steps; rate chosen on validation, 3 seeds), test accuracy, mean [min, max] | " \
           f"**{yoso[0]}** {yoso[1]} | {' '.join(softmax)} |" in readme
    yoso, softmax = _protocol_yoso_and_softmax("mqar 128 8 1000")  # a tie at 3 decimals: neither in bold
    assert f"vocabulary 8,192, 1,000 steps; rate chosen on validation, 3 seeds), test accuracy, mean [min, max] | " \
           f"{' '.join(yoso)} | {' '.join(softmax)} |" in readme
    equal = {first["label"]: row for first, row in report.state_configurations(STATE_RECORDS, "mqar 64 8 250")
             if first["state_bytes_per_layer"] == 32_768}
    yoso, softmax = _mean_range(equal["yoso(num_hashes=8,hash_code_len=4)"]), _mean_range(equal["softmax"])
    assert f"YOSO m = 8, τ = 4) | {' '.join(yoso)} | **{softmax[0]}** {softmax[1]} |" in readme
    tags = [r for r in PROTOCOL_RECORDS if report.cell_key(r) == "tags 512 300"]
    yoso, softmax = (report.protocol.summarize([r for r in tags if r["label"] == label])
                     for label in ("yoso", "softmax"))
    assert all(row["complete"] and row["interior"] for row in (yoso, softmax))
    assert (f"seeds that learned (test accuracy of those) | {yoso['seeds_kept']} of {yoso['seeds_run']} "
            f"({yoso['test_mean']:.3f}) | **{softmax['seeds_kept']} of {softmax['seeds_run']}** "
            f"({softmax['test_mean']:.3f}) |") in readme
    lm = [r for r in PROTOCOL_RECORDS if report.cell_key(r) == "lm 1024 500"]
    rows = {runs[0]["label"]: report.protocol.summarize(runs) for runs in report.configurations(lm).values()}
    yoso, softmax, floor = rows["yoso"], rows["softmax"], rows["none"]  # configurations: the floor's runs once
    assert all(row["complete"] for row in (yoso, softmax, floor)) and yoso["interior"] and yoso["seeds_kept"] == 3
    assert softmax["chosen_lr"] is None  # every rate failed: the README says so, with no number
    assert (f"the model with no attention: {floor['test_mean']:.3f} | **{yoso['test_mean']:.3f}** "
            f"[{yoso['test_min']:.3f}, {yoso['test_max']:.3f}] | learned at no rate ") in readme


def test_the_layer_docstring_quotes_the_records():
    docstring = " ".join(_read("keras_yoso", "layers", "yoso_attention.py").split())
    rows = {(first["attention"], first.get("settings")): row
            for first, row in report.state_configurations(STATE_RECORDS, "mqar 64 8 250")}
    mean = {tau: f"{rows['yoso', f'm=32,tau={tau}']['test_mean']:.3f}" for tau in (5, 6, 8)}
    softmax = f"{rows['softmax', '-']['test_mean']:.3f}"
    assert f"{mean[5]} at tau 5, {mean[6]} at tau 6, {mean[8]} at tau 8, softmax {softmax}" in docstring
    tags = [r for r in PROTOCOL_RECORDS if report.cell_key(r) == "tags 512 300"]
    default = report.protocol.summarize([r for r in tags if r["label"] == "yoso"])
    assert default["chosen_lr"] == 1e-2 and (default["seeds_kept"], default["seeds_run"]) == (2, 3)
    assert "tau 6 learned at 1e-2 on 2 seeds of 3" in docstring


def test_a_run_that_diverged_or_learned_nothing_is_never_an_accuracy():
    cell = [r for r in RECORDS if report.cell_key(r) == "mqar 64 4 400"]
    performer = [r for r in cell if r["label"] == "performer"]
    assert performer and all(report.failure(r) == "diverged" for r in performer)
    assert all(report.failure(r) == "learned nothing" for r in cell if r["label"] == "gated_deltanet")
    table = report.render(RECORDS, "mqar 64 4 400")
    assert re.search(r"\| performer \|.*\| 0\.003: failed \|", table)


def test_every_protocol_cell_is_published_as_a_rendered_block():
    assert PROTOCOL_RECORDS, "no docs/data/quality_protocol_*.json"
    assert sorted(key for key, _ in PROTOCOL_TABLES) == sorted({report.cell_key(r) for r in PROTOCOL_RECORDS})


@pytest.mark.parametrize("key, published", PROTOCOL_TABLES, ids=[key for key, _ in PROTOCOL_TABLES])
def test_each_published_protocol_table_is_what_the_records_give(key, published):
    assert published == report.render_protocol(PROTOCOL_RECORDS, key), \
        f"re-render with python benchmarks/quality/report.py --protocol ({key})"


def test_the_protocol_report_draws_each_cells_figure_from_its_rows(tmp_path, capsys):
    report.main(["--protocol", "--plot", str(tmp_path)])
    keys = sorted({report.cell_key(r) for r in PROTOCOL_RECORDS})
    drawn = sorted(path.name for path in tmp_path.iterdir())
    assert drawn == sorted(f"quality_protocol_{key.replace(' ', '_')}.png" for key in keys)
    assert all((tmp_path / name).stat().st_size > 10_000 for name in drawn)
    assert f"<!-- quality-protocol-table: {keys[0]} -->" in capsys.readouterr().out


def test_the_report_prints_its_usage_on_help_and_refuses_an_unknown_option(capsys):
    report.main(["--help"])
    assert "python benchmarks/quality/report.py --write docs/quality.md" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown option '--sate': the options are --write, --protocol, --state"):
        report.main(["--sate"])


def test_every_equal_state_cell_is_published_as_a_rendered_block():
    assert STATE_RECORDS, "no docs/data/quality_state_*.json"
    assert sorted(key for key, _ in STATE_TABLES) == sorted({report.cell_key(r) for r in STATE_RECORDS})
    assert sorted(key for key, _ in SWEEP_TABLES) == sorted({report.cell_key(r) for r in STATE_RECORDS}
                                                            | set(report.sweep_cells(PROTOCOL_RECORDS)))


@pytest.mark.parametrize("key, published", STATE_TABLES, ids=[key for key, _ in STATE_TABLES])
def test_each_published_equal_state_table_is_what_the_records_give(key, published):
    assert published == report.render_state(STATE_RECORDS, key), \
        f"re-render with python benchmarks/quality/report.py --state ({key})"


@pytest.mark.parametrize("key, published", SWEEP_TABLES, ids=[key for key, _ in SWEEP_TABLES])
def test_each_published_defaults_sweep_is_what_the_records_give(key, published):
    """The equal-state cells' sweeps (report.py --state) and the protocol cells' (report.py --protocol: tags)."""
    state = key in {report.cell_key(r) for r in STATE_RECORDS}
    assert published == report.render_sweep(STATE_RECORDS if state else PROTOCOL_RECORDS, key), \
        f"re-render with python benchmarks/quality/report.py {'--state' if state else '--protocol'} ({key})"


def test_a_protocol_table_shows_a_failed_runs_score_after_the_word_failed():
    table = report.render_protocol(PROTOCOL_RECORDS, "mqar 32 4 250")
    gated, = (line for line in table.splitlines() if line.startswith("| gated_deltanet"))
    assert "| failed (0.025) | 0.123 |" in gated  # lr 3e-3 learned nothing: below the floor's 0.049 + 0.01


def test_a_protocol_table_run_under_several_machine_notes_points_to_each_commands_note():
    table = report.render_protocol(PROTOCOL_RECORDS, "mqar 32 4 750")
    notes = {r["protocol"]["machine_note"] for r in PROTOCOL_RECORDS if report.cell_key(r) == "mqar 32 4 750"}
    assert len(notes) == 2 and "the machine: not quiet (2 notes: each command's --machine-note below)." in table
    commands = [line for line in table.splitlines() if line.startswith("    python ")]
    assert all(sum(report.shlex.quote(note) in command for command in commands) >= 1 for note in notes)


def test_report_write_leaves_the_published_page_as_it_is():
    rewritten, _ = report.write_page(PAGE, RENDERED)
    assert rewritten == PAGE, "re-render with python benchmarks/quality/report.py --write docs/quality.md"


def test_report_write_replaces_a_stale_block_and_names_the_cells_the_page_lacks():
    key, published = PROTOCOL_TABLES[0]
    stale = f"intro\n<!-- quality-protocol-table: {key} -->\n| old | table |\n<!-- /quality-table -->\noutro\n"
    rewritten, missing = report.write_page(stale, RENDERED)
    assert rewritten == f"intro\n{report.block('protocol-table', key, published)}\noutro\n"
    assert ("protocol-table", key) not in missing and len(missing) == len(RENDERED) - 1


def test_report_write_names_a_page_it_cannot_read(tmp_path):
    with pytest.raises(SystemExit, match=r"--write: cannot read the page .*missing\.md"):
        report.main(["--write", str(tmp_path / "missing.md")])


def test_report_write_refuses_a_block_that_no_record_gives():
    page = "<!-- quality-protocol-table: mqar 999 9 9 -->\n| a |\n<!-- /quality-table -->\n"
    with pytest.raises(ValueError, match="mqar 999 9 9.*no records"):
        report.write_page(page, RENDERED)


def _row(attention, state, mean, complete=True, floor=False):
    first = {"attention": attention, "label": attention, "state_bytes_per_layer": state,
             "status": "floor" if floor else "ok", "lr": 0.01, "seed": 0}
    return first, {"test_mean": mean, "complete": complete}


def test_the_frontier_keeps_what_no_configuration_beats_with_no_more_state():
    rows = [_row("small", 1_000, 0.5), _row("same_state_better", 1_000, 0.6), _row("bigger_worse", 5_000, 0.55),
            _row("bigger_better", 5_000, 0.9), _row("unfinished", 100, 0.99, complete=False),
            _row("floor", 0, 0.01, floor=True), _row("tie_at_more_state", 9_000, 0.9)]
    kept = {json.loads(key)[report.plot.CONFIG_KEYS.index("label")] for key in report.frontier(rows)}
    assert kept == {"same_state_better", "bigger_better"}


@pytest.mark.parametrize("source", ["protocol", "state"])
def test_the_protocol_records_chose_on_validation_and_ran_three_seeds_at_the_choice(source):
    render = report.render_protocol if source == "protocol" else report.render_state
    records = PROTOCOL_RECORDS if source == "protocol" else STATE_RECORDS
    for runs in report.configurations(records).values():
        assert all(r["validation_accuracy"] is not None and r["validation_size"] > 0 for r in runs)
        assert all(r["status"] in ("floor", "ok", "diverged", "learned_nothing") for r in runs)
        assert all((r["failure"] is None) == (r["status"] in ("floor", "ok")) for r in runs)
        row = report.protocol.summarize(runs)
        if not row["complete"]:  # stopped at a deadline: the table says so
            assert "protocol stopped before its end" in render(records, report.cell_key(runs[0]))
            continue
        grid = [r for r in runs if r["protocol"]["phase"] == "grid"]
        assert len({r["lr"] for r in grid}) >= report.protocol.GRID_MIN and all(r["seed"] == 0 for r in grid)
        if row["chosen_lr"] is not None:
            assert sorted(r["seed"] for r in runs if r["lr"] == row["chosen_lr"]) == list(report.protocol.SEEDS)
            assert row["interior"] or row["extensions"] == runs[0]["protocol"]["max_extensions"]


convert = _script("convert_benchmark", "benchmarks", "convert_pretrained.py")
FINE_TUNE_TABLES = [(page, key, body) for page in sorted(os.listdir(os.path.join(REPO, "docs"))) if page.endswith(".md")
                    for key, body in convert.published_blocks(_read("docs", page)).items()]


@pytest.mark.parametrize("page, key, published", FINE_TUNE_TABLES, ids=[key for _, key, _ in FINE_TUNE_TABLES])
def test_each_published_fine_tune_table_is_what_its_records_give(page, key, published):
    paths = [os.path.join(REPO, path) for path in key.split()]
    assert published == convert.render(paths), (f"re-render docs/{page} with python benchmarks/convert_pretrained.py "
                                                f"--render {key} --write docs/{page}")


def test_every_fine_tune_record_file_is_published_as_a_rendered_block():
    published = {path for _, key, _ in FINE_TUNE_TABLES for path in key.split()}
    recorded = {f"docs/data/{name}" for name in os.listdir(os.path.join(REPO, "docs", "data"))
                if name.startswith("convert_protocol_") and name.endswith(".json")}
    assert recorded <= published, (f"records with no <!-- convert-protocol-table --> block: "
                                   f"{sorted(recorded - published)}")


def test_the_readme_quotes_the_imdb_fine_tune_rows_of_their_records():
    table = convert.render([os.path.join(REPO, "docs", "data", name)
                            for name in ("convert_protocol_imdb.json", "convert_protocol_imdb_b.json")])
    readme = " ".join(_read("README.md").split())
    for mode in ("transferred", "softmax", "yoso", "scratch"):
        row = next(line for line in table.splitlines() if line.startswith(f"| {mode} |"))
        quoted = re.search(r"(\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]) \(3 of 3\)", row).group(1)
        assert quoted in readme, (mode, quoted)
