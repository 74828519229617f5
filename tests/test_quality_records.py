"""Every published quality number follows from the records (issue 43, item 1): the tables of
docs/quality.md are what benchmarks/quality/report.py renders from docs/data, and the README's
results table quotes the same records."""

import importlib.util
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.all_cases  # every table on every backend (cheap)
_BLOCK = re.compile(r"<!-- quality-table: (.+?) -->\n(.*?)\n<!-- /quality-table -->", re.S)


def _report():
    spec = importlib.util.spec_from_file_location("quality_report", os.path.join(REPO, "benchmarks", "quality",
                                                                                   "report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


report = _report()
RECORDS = report.load()
TABLES = _BLOCK.findall(_read("docs", "quality.md"))


def test_the_quality_page_publishes_its_tables_as_rendered_blocks():
    assert {key for key, _ in TABLES} >= {"mqar 64 4 400", "mqar 128 8 400", "mqar 256 16 1000", "tags 512 300",
                                          "lm 1024 500"}


@pytest.mark.parametrize("key, published", TABLES, ids=[key for key, _ in TABLES])
def test_each_published_table_is_what_the_records_give(key, published):
    assert published == report.render(RECORDS, key), f"re-render with python benchmarks/quality/report.py ({key})"


def _chosen(key, label):
    """(mean over the seeds that did not fail, seeds kept, seeds run) at the chosen rate of `label` in cell `key`."""
    cell = [r for r in RECORDS if report.cell_key(r) == key and r["label"] == label]
    summary, = report.plot.best_lr(cell)
    runs = [r for r in cell if r["lr"] == summary["lr"]]
    kept = [report._value(r) for r in runs if not report.failure(r)]
    return sum(kept) / len(kept), len(kept), len(runs)


def test_the_readme_results_table_quotes_the_records():
    readme = _read("README.md")
    yoso, _, _ = _chosen("mqar 256 16 1000", "yoso, tau 6 (default)")
    softmax, _, _ = _chosen("mqar 256 16 1000", "softmax")
    assert re.search(rf"accuracy over 3 seeds \| \*\*{yoso:.3f}\*\* \| {softmax:.3f} \|", readme)
    _, yoso_kept, yoso_runs = _chosen("tags 512 300", "yoso")
    _, softmax_kept, softmax_runs = _chosen("tags 512 300", "softmax")
    assert f"| {yoso_kept} of {yoso_runs} | **{softmax_kept} of {softmax_runs}** |" in readme
    yoso_bits, _, _ = _chosen("lm 1024 500", "yoso")
    softmax_bits, _, _ = _chosen("lm 1024 500", "softmax")
    assert f"| **{yoso_bits:.2f}** | {softmax_bits:.2f} |" in readme


def test_a_run_that_diverged_or_learned_nothing_is_never_an_accuracy():
    cell = [r for r in RECORDS if report.cell_key(r) == "mqar 64 4 400"]
    performer = [r for r in cell if r["label"] == "performer"]
    assert performer and all(report.failure(r) == "diverged" for r in performer)
    assert all(report.failure(r) == "learned nothing" for r in cell if r["label"] == "gated_deltanet")
    table = report.render(RECORDS, "mqar 64 4 400")
    assert re.search(r"\| performer \|.*\| 0\.003: failed \|", table)
