"""Associative recall, the field's test of efficient attention (MQAR: Arora et al. 2023, "Zoology"),
learned on this backend by softmax attention and by YosoAttention with its default settings.

A CI-sized cell of benchmarks/quality (the same generator, model and training loop as
docs/quality.md): sequences of 32 tokens holding 4 key-value pairs and then each key once more,
vocabulary 256, a 2-layer width-64 model of [causal short convolution, causal attention] blocks,
250 Adam steps of 64 fresh sequences at learning rate 1e-2; accuracy of the value predicted at the
query positions of 256 held-out sequences. Chance is 1/128.
"""

import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(REPO, "benchmarks", "quality"), os.path.join(REPO, "examples")]

import run  # noqa: E402


@pytest.mark.parametrize("attention", ["softmax", "yoso"])
def test_two_layer_model_learns_multi_query_associative_recall(attention, tmp_path):
    run.main(["--task", "mqar", "--attention", attention, "--length", "32", "--pairs", "4", "--vocab", "256",
              "--width", "64", "--layers", "2", "--steps", "250", "--batch-size", "64", "--lr", "1e-2",
              "--seeds", "0", "--test-size", "256", "--out", str(tmp_path)])
    with open(tmp_path / "results.json") as f:
        (record,) = json.load(f)
    assert record["attention"] == attention and record["steps_done"] == 250
    assert record["accuracy"] >= 0.9, record["accuracy"]
