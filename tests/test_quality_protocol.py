"""The protocol of benchmarks/quality/protocol.py (issue 43, item 2) with a fake trainer: the grid is
extended until its best rate on the validation split is interior (bounded), the test split never
chooses, failed runs are never chosen nor averaged, and seeds 1 and 2 run at the chosen rate. Then
real tiny protocols end to end (MQAR, classification and bytes; 5 eager runs of 2-4 steps of a width-8 model
each), on PyTorch only (`runs_on`: they test the driver, not the backend; 19 s there against 121 s on
TensorFlow, which traces each run's graph; measured 2026-12-02), and the data splits' generators on
TensorFlow only (NumPy, no backend)."""

import importlib
import json
import math
import os
import sys

import numpy as np
import pytest

from conftest import runs_on

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "benchmarks", "quality"), os.path.join(REPO, "examples")]

protocol = importlib.import_module("protocol")
tasks = importlib.import_module("tasks")

pytestmark = pytest.mark.all_cases


class FakeTrainer:
    """train(lr, seed, phase) -> a record whose validation and test accuracies are functions of the rate
    (`validation(lr)`, `test(lr)`, plus `seed_offset * seed`); rates in `diverge` diverge."""

    def __init__(self, validation, test=None, diverge=(), learned_nothing=(), seed_offset=0.0):
        self.validation, self.test = validation, test or validation
        self.diverge, self.learned_nothing, self.seed_offset = set(diverge), set(learned_nothing), seed_offset
        self.calls = []

    def __call__(self, lr, seed, phase):
        self.calls.append((lr, seed, phase))
        status = "diverged" if lr in self.diverge else "learned_nothing" if lr in self.learned_nothing else "ok"
        return {"task": "mqar", "lr": lr, "seed": seed, "status": status,
                "protocol": {"phase": phase, "max_extensions": 2},
                "validation_accuracy": math.nan if status == "diverged" else self.validation(lr),
                "accuracy": math.nan if status == "diverged" else self.test(lr) + self.seed_offset * seed}


def _peak_at(best):
    return lambda lr: 1.0 - abs(math.log10(lr) - math.log10(best))


def test_an_interior_best_runs_no_extension_and_three_seeds_at_it():
    train = FakeTrainer(_peak_at(1e-2), seed_offset=0.01)
    records = protocol.run_protocol(train, [3e-3, 1e-2, 3e-2])
    assert train.calls == [(3e-3, 0, "grid"), (1e-2, 0, "grid"), (3e-2, 0, "grid"), (1e-2, 1, "seeds"),
                           (1e-2, 2, "seeds")]
    row = protocol.summarize(records)
    assert row["chosen_lr"] == 1e-2 and row["interior"] and row["extensions"] == 0
    assert row["seeds_kept"] == row["seeds_run"] == 3
    assert row["test_mean"] == pytest.approx(1.01) and (row["test_min"], row["test_max"]) == (1.0, 1.02)


def test_the_grid_is_extended_at_the_edge_until_the_best_is_interior():
    train = FakeTrainer(_peak_at(0.1))
    records = protocol.run_protocol(train, [3e-3, 1e-2, 3e-2], extend_factor=3.0, max_extensions=3)
    assert [c for c in train.calls if c[2] == "extension"] == [(0.09, 0, "extension"), (0.27, 0, "extension")]
    row = protocol.summarize(records)
    assert row["chosen_lr"] == 0.09 and row["interior"] and row["extensions"] == 2
    assert [c[:2] for c in train.calls if c[2] == "seeds"] == [(0.09, 1), (0.09, 2)]
    low = FakeTrainer(_peak_at(1e-4))
    protocol.run_protocol(low, [3e-3, 1e-2, 3e-2], max_extensions=1)
    assert [c for c in low.calls if c[2] == "extension"] == [(1e-3, 0, "extension")]


def test_the_extensions_are_bounded_and_a_best_still_at_the_edge_is_recorded_as_such():
    train = FakeTrainer(lambda lr: lr)  # always better higher
    records = protocol.run_protocol(train, [1e-3, 1e-2, 1e-1], extend_factor=10.0, max_extensions=2)
    row = protocol.summarize(records)
    assert row["chosen_lr"] == 10.0 and not row["interior"] and row["edge"] == 1 and row["extensions"] == 2
    assert len(train.calls) == 3 + 2 + 2


def test_the_rate_is_chosen_on_validation_never_on_test():
    # validation prefers 1e-2; the test split would prefer 3e-2 by far
    train = FakeTrainer(_peak_at(1e-2), test=lambda lr: 1.0 if lr == 3e-2 else 0.5)
    row = protocol.summarize(protocol.run_protocol(train, [3e-3, 1e-2, 3e-2]))
    assert row["chosen_lr"] == 1e-2 and row["test_mean"] == 0.5
    assert row["validation"] == {3e-3: pytest.approx(1 - math.log10(10 / 3)), 1e-2: 1.0,
                                 3e-2: pytest.approx(1 - math.log10(3))}


def test_failed_runs_are_never_chosen_nor_averaged_and_are_named():
    # the best validation rate diverges: the next best is chosen, the diverged rate still counts as tried
    train = FakeTrainer(_peak_at(3e-2), diverge={3e-2}, learned_nothing={3e-3})
    records = protocol.run_protocol(train, [3e-3, 1e-2, 3e-2])
    row = protocol.summarize(records)
    assert row["chosen_lr"] == 1e-2 and row["interior"]
    assert row["validation"][3e-2] is None and row["validation"][3e-3] is None
    assert [(r["lr"], r["status"]) for r in row["failed"]] == [(3e-3, "learned_nothing"), (3e-2, "diverged")]
    assert row["seeds_kept"] == 3 and not math.isnan(row["test_mean"])
    # a seed that fails at the chosen rate is named and left out of the mean
    seed_fails = FakeTrainer(_peak_at(1e-2), seed_offset=0.1)
    records = protocol.run_protocol(seed_fails, [3e-3, 1e-2, 3e-2])
    records[-1]["status"] = "diverged"
    records[-1]["accuracy"] = math.nan
    row = protocol.summarize(records)
    assert (row["seeds_kept"], row["seeds_run"]) == (2, 3) and row["test_mean"] == pytest.approx(1.05)
    assert [(r["lr"], r["seed"]) for r in row["failed"]] == [(1e-2, 2)]


def test_a_protocol_stopped_before_its_end_is_marked_incomplete():
    records = protocol.run_protocol(FakeTrainer(_peak_at(0.1)), [3e-3, 1e-2, 3e-2], max_extensions=2)
    assert protocol.summarize(records)["complete"]
    assert not protocol.summarize(records[:2])["complete"]  # stopped in the grid
    assert not protocol.summarize(records[:3])["complete"]  # best at the edge, extensions left
    assert not protocol.summarize(records[:-1])["complete"]  # 2 of 3 seeds at the chosen rate


def test_when_every_rate_fails_the_grid_grows_at_both_ends_then_no_seed_runs_and_nothing_is_averaged():
    train = FakeTrainer(_peak_at(1e-2), diverge={3e-3, 1e-2, 3e-2}, learned_nothing={1e-3, 9e-2})
    records = protocol.run_protocol(train, [3e-3, 1e-2, 3e-2], extend_factor=3.0, max_extensions=2)
    assert [c for c in train.calls if c[2] == "extension"] == [(1e-3, 0, "extension"), (9e-2, 0, "extension")]
    row = protocol.summarize(records)
    assert len(train.calls) == 5 and row["chosen_lr"] is None and row["test_mean"] is None
    assert len(row["failed"]) == 5 and row["complete"] and row["extensions"] == 2
    assert not protocol.summarize(records[:3])["complete"]  # both ends still to try
    assert not protocol.summarize(records[:4])["complete"]  # one end tried, the other still to try
    # one end learns: the protocol goes on from there (here no extension is left: the best stays at the edge)
    rescued = FakeTrainer(lambda lr: lr, diverge={3e-3, 1e-2, 3e-2})
    row = protocol.summarize(protocol.run_protocol(rescued, [3e-3, 1e-2, 3e-2], max_extensions=2))
    assert row["chosen_lr"] == 9e-2 and row["edge"] == 1 and row["complete"] and row["seeds_kept"] == 3
    # with fewer than two extensions left, no end is tried
    one = FakeTrainer(_peak_at(1e-2), diverge={3e-3, 1e-2, 3e-2})
    row = protocol.summarize(protocol.run_protocol(one, [3e-3, 1e-2, 3e-2], max_extensions=1))
    assert len(one.calls) == 3 and row["chosen_lr"] is None


def test_a_grid_of_fewer_than_three_rates_is_refused():
    with pytest.raises(ValueError, match="at least 3 distinct positive rates, got"):
        protocol.run_protocol(FakeTrainer(_peak_at(1e-2)), [1e-3, 1e-2, 1e-2])
    with pytest.raises(ValueError, match="extend_factor must be > 1, got 1.0"):
        protocol.run_protocol(FakeTrainer(_peak_at(1e-2)), [1e-3, 1e-2, 1e-1], extend_factor=1.0)


def test_the_harness_judges_a_protocol_run_on_validation_against_the_floor():
    run = importlib.import_module("run")
    base = {"task": "mqar", "steps": 250, "steps_done": 250, "loss": 1.0, "diverged": None, "pairs": 4,
            "test_size": 1000, "validation_size": 1000}
    floor = {**base, "accuracy": 0.9, "validation_accuracy": 0.05}
    # the test split would call it "learned nothing" against this floor; validation judges it
    assert run.judge({**base, "accuracy": 0.5, "validation_accuracy": 0.5}, floor, split="validation") == ("ok", None)
    status, why = run.judge({**base, "accuracy": 0.99, "validation_accuracy": 0.055}, floor, split="validation",
                            floor_is="its best seed-0 validation accuracy, lr 0.03")
    assert status == "learned_nothing" and why.startswith("validation accuracy 0.0550 does not beat")
    assert "its best seed-0 validation accuracy, lr 0.03" in why
    with pytest.raises(ValueError, match="split must be 'test' or 'validation', got 'train'"):
        run.judge({**base, "accuracy": 0.5}, floor, split="train")


def test_mqar_validation_and_training_sequences_are_never_test_sequences():
    shape = (12, 2, 8)  # so small that random sequences collide often
    test = tasks.mqar_batch(np.random.default_rng(1), 200, *shape)
    held_out = tasks.sequence_set(test[0])
    validation = tasks.mqar_batch_excluding(np.random.default_rng(2), 200, *shape, excluded=held_out)
    assert not tasks.sequence_set(validation[0]) & held_out
    held_out |= tasks.sequence_set(validation[0])
    tokens, positions, targets = tasks.mqar_batch_excluding(np.random.default_rng(3), 500, *shape, excluded=held_out)
    assert not tasks.sequence_set(tokens) & held_out
    assert (np.take_along_axis(tokens, positions, 1) < 4).all() and (targets >= 4).all()  # still MQAR rows
    # without a collision the batch is mqar_batch's, draw for draw
    plain = tasks.mqar_batch(np.random.default_rng(4), 8, 64, 4, 256)
    kept = tasks.mqar_batch_excluding(np.random.default_rng(4), 8, 64, 4, 256, excluded=set())
    assert all((a == b).all() for a, b in zip(plain, kept))


@runs_on("tensorflow")
@pytest.mark.parametrize("task", ["tags", "listops"])
def test_classification_validation_examples_are_never_training_or_test_examples(task):
    data = tasks.load_classification(task, 64, 200, 100, 100)
    as_text = lambda ids: {tuple(np.asarray(row).tolist()) for row in ids}  # noqa: E731
    validation = as_text(data.validation_ids)
    assert len(data.validation_ids) == len(data.validation_labels) == 100
    assert not validation & (as_text(data.train_ids) | as_text(data.test_ids))
    assert set(np.unique(data.validation_labels)) <= set(range(data.num_classes))
    # asking for a validation split leaves the training and test examples as they were
    plain = tasks.load_classification(task, 64, 200, 100, 0)
    assert as_text(plain.train_ids) == as_text(data.train_ids) and as_text(plain.test_ids) == as_text(data.test_ids)
    assert len(plain.validation_ids) == 0 and plain.validation_labels.shape == (0,)


def test_the_lm_protocol_chooses_the_lowest_validation_bits_per_byte_and_reports_test_bits_per_byte():
    def lm(lr, seed, validation, test):
        return {"task": "lm", "lr": lr, "seed": seed, "status": "ok", "protocol": {"phase": "grid"},
                "validation_accuracy": 0.9 - validation, "validation_bits_per_byte": validation,
                "accuracy": 0.9 - test, "bits_per_byte": test}

    records = [lm(1e-3, 0, 2.9, 2.0), lm(3e-3, 0, 2.6, 2.8), lm(1e-2, 0, 2.7, 2.1), lm(3e-3, 1, 2.5, 2.7),
               lm(3e-3, 2, 2.5, 2.6)]
    assert protocol.choose(records[:3]) == (3e-3, 0)  # not 1e-3, the best on test, nor by accuracy's order
    row = protocol.summarize(records)
    assert row["metric"] == "bits per byte" and not row["higher_is_better"]
    assert row["validation"] == {1e-3: 2.9, 3e-3: 2.6, 1e-2: 2.7}
    assert (row["test_mean"], row["test_min"], row["test_max"]) == (pytest.approx(2.7), 2.6, 2.8)


def _fake_imdb(monkeypatch, held_out_reviews):
    """tasks' IMDB files replaced by 300 short training and 100 test reviews; training review 7 is also
    review 8 and test review 0 is training review 9 (the real files repeat reviews too)."""
    train = [f"train review {i} " + "x" * (i % 13) for i in range(300)]
    train[8], test = train[7], [train[9]] + [f"test review {i}" for i in range(1, 100)]
    splits = {"train": (train, np.zeros(300, np.int32)), "test": (test, np.zeros(100, np.int32))}
    for cached in (tasks.imdb_bytes, tasks.lm_data):
        cached.cache_clear()
    monkeypatch.setattr(tasks, "imdb_split", lambda split: splits[split])
    monkeypatch.setattr(tasks, "LM_VALIDATION_REVIEWS", held_out_reviews)
    return train, test


def test_lm_validation_windows_read_held_out_training_reviews_that_no_training_window_reads(monkeypatch):
    train, test = _fake_imdb(monkeypatch, held_out_reviews=60)
    try:
        plain_train, none, plain_test = tasks.lm_data(False)
        assert none is None and plain_train.tobytes().decode().split("\n") == train
        kept, validation, held_test = tasks.lm_data(True)
        kept, validation = (part.tobytes().decode().split("\n") for part in (kept, validation))
        assert held_test.tobytes() == plain_test.tobytes() and plain_test.tobytes().decode().split("\n") == test
        assert len(kept) == 240 and 0 < len(validation) <= 60
        assert not set(validation) & (set(kept) | set(test))  # repeated reviews never reach validation
        assert set(kept) | set(validation) <= set(train) and kept == sorted(kept, key=train.index)  # file order
    finally:
        for cached in (tasks.imdb_bytes, tasks.lm_data):
            cached.cache_clear()


@runs_on("torch")
def test_a_tiny_lm_protocol_records_validation_bits_per_byte(tmp_path, monkeypatch):
    _fake_imdb(monkeypatch, held_out_reviews=60)
    out = tmp_path / "protocol.json"
    try:
        rows = protocol.main(["--task", "lm", "--attention", "none", "--length", "16", "--width", "8", "--layers", "1",
                              "--heads", "1", "--steps", "2", "--batch-size", "4", "--test-size", "4",
                              "--validation-size", "6", "--lr", "1e-3", "3e-3", "1e-2", "--max-extensions", "0",
                              "--no-jit", "--machine-note", "CI", "--out", str(out)])
    finally:
        for cached in (tasks.imdb_bytes, tasks.lm_data):
            cached.cache_clear()
    records = json.loads(out.read_text())
    assert len(records) == 5 and all(r["validation_size"] == 6 and "6 windows" in r["data"] for r in records)
    assert all(r["validation_bits_per_byte"] > 0 and r["bits_per_byte"] > 0 for r in records)
    seed0 = [r for r in records if r["seed"] == 0]
    assert rows["none"]["chosen_lr"] == min(seed0, key=lambda r: r["validation_bits_per_byte"])["lr"]
    assert rows["none"]["metric"] == "bits per byte"


def test_a_validation_example_that_is_also_a_training_example_is_refused():
    with pytest.raises(ValueError, match="1 of 2 validation examples are also training or test examples"):
        tasks._check_disjoint(["a b", "c d"], ["x", "c d"], ["y"])


@runs_on("torch")
def test_a_classification_protocol_scores_every_run_on_its_validation_split(tmp_path):
    """The tags task under the protocol (tiny): every record holds a validation accuracy of its own split."""
    out = tmp_path / "protocol.json"
    protocol.main(["--task", "tags", "--attention", "none", "--length", "16", "--width", "8", "--layers", "1",
                   "--heads", "1", "--steps", "2", "--batch-size", "8", "--train-size", "32", "--test-size", "16",
                   "--validation-size", "24", "--lr", "1e-3", "3e-3", "1e-2", "--max-extensions", "0", "--no-jit",
                   "--machine-note", "CI", "--out", str(out)])
    records = json.loads(out.read_text())
    assert len(records) == 5 and all(r["validation_size"] == 24 for r in records)
    assert all(0 <= r["validation_accuracy"] <= 1 for r in records)
    assert all("24 validation" in r["data"] for r in records)


@runs_on("torch")
def test_a_real_tiny_protocol_records_validation_and_test_and_resumes(tmp_path):
    """The driver end to end on the model with no attention (the floor every protocol runs first): 3 rates,
    then seeds 1 and 2 at the best on validation; each record holds both scores; a second invocation
    reuses every record."""
    out = tmp_path / "protocol.json"
    argv = ["--task", "mqar", "--attention", "none", "--length", "12", "--pairs", "2", "--vocab", "16",
            "--width", "8", "--layers", "1", "--heads", "1", "--steps", "4", "--batch-size", "8", "--test-size", "16",
            "--validation-size", "16", "--lr", "1e-3", "3e-3", "1e-2", "--max-extensions", "0", "--no-jit",
            "--machine-note", "CI", "--out", str(out)]
    rows = protocol.main(argv)
    records = json.loads(out.read_text())
    assert len(records) == 5 and {r["attention"] for r in records} == {"none"}
    assert sorted(r["seed"] for r in records if r["lr"] == rows["none"]["chosen_lr"]) == [0, 1, 2]
    assert [r["protocol"]["phase"] for r in records] == ["grid"] * 3 + ["seeds"] * 2
    assert all(0 <= r["validation_accuracy"] <= 1 and 0 <= r["accuracy"] <= 1 for r in records)
    assert all(r["validation_size"] == 16 and r["status"] == "floor" for r in records)
    assert all(r["protocol"]["machine_note"] == "CI" and not r["protocol"]["machine_quiet"] for r in records)
    assert _essentials(rows["none"]) == _essentials(protocol.summarize(records))
    again = protocol.main(argv)  # every run is in the file: nothing trains again
    assert len(json.loads(out.read_text())) == 5 and _essentials(again["none"]) == _essentials(rows["none"])


def _essentials(row):
    return (row["chosen_lr"], row["interior"], row["test_mean"], row["seeds_kept"], row["seeds_run"],
            [(r["lr"], r["seed"], r["status"]) for r in row["failed"]])
