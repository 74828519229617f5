"""A model of data_parallel_training wrapped in torch.nn.parallel.DistributedDataParallel, 2 processes
on the gloo backend (CPU), each rank holding half of each global batch, trained by a manual loop with
a torch optimizer, matches one process trained on the whole global batch: the ranks hold identical
weights, the losses and weights match, and each rank's hash seed advanced once per step. The ranks
exchange their files in the current directory.

    KERAS_BACKEND=torch python tests/programs/data_parallel_ddp.py CASE [CASE ...]

Each CASE (yoso/custom_op, yoso/composite, linear_relative: data_parallel_training.case_of) is trained
by one process, then by the two ranks of one DDP run (they train every case in turn); the comparison
of each case reports on its own (program_cases.run_cases).
"""

import os
import pickle
import sys

import numpy as np
import torch
import torch.multiprocessing

from data_parallel_training import (GLOBAL_BATCH, LEARNING_RATE, MOMENTUM, STEPS, assert_same_training, batches,
                                    build_model, case_of, seed_states)
from program_cases import run_cases


def train(model, module, tokens, targets, world_size=1):
    """A manual loop: forward through `module` (the model, or its DDP wrapper), mean squared error of
    this process's rows, backward (DDP all-reduces and averages the gradients), SGD step over the
    model's trainable torch parameters. Returns the global-batch loss of each step."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(parameters, lr=LEARNING_RATE, momentum=MOMENTUM)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad()
        prediction = module(torch.as_tensor(tokens[step]), training=True)
        loss = torch.mean((prediction - torch.as_tensor(targets[step])) ** 2)
        loss.backward()
        optimizer.step()
        loss = loss.detach().clone()
        if world_size > 1:  # the global loss: the mean of the ranks' equal-size half-batch means
            torch.distributed.all_reduce(loss)
            loss = loss / world_size
        losses.append(float(loss))
    return losses


def _file(name):
    return name.replace("/", "_")


def rank_main(rank, world_size, directory, names):
    """One DDP rank (torch.multiprocessing.spawn pickles it by reference: it lives in this file, whose
    top-level run is guarded by __main__): trains each case on its rows from the case's saved initial
    weights, saves {case: (losses, weights, seed states)} as rank<rank>.pickle."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=world_size)
    try:
        tokens, targets = batches()
        rows = slice(rank * GLOBAL_BATCH // world_size, (rank + 1) * GLOBAL_BATCH // world_size)
        results = {}
        for name in names:
            model = build_model(*case_of(name))
            with np.load(f"{directory}/{_file(name)}_initial.npz") as initial:
                model.set_weights([initial[f"arr_{i}"] for i in range(len(initial.files))])
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            losses = train(model, ddp, tokens[:, rows], targets[:, rows], world_size)
            results[name] = (losses, model.get_weights(), seed_states(model))
        with open(f"{directory}/rank{rank}.pickle", "wb") as f:
            pickle.dump(results, f)
    finally:
        torch.distributed.destroy_process_group()


def main(names):
    for name in names:
        case_of(name)  # a bad name stops the run before anything is trained
    torch.set_num_threads(1)
    directory = os.getcwd()
    tokens, targets = batches()
    initial, reference, trainable = {}, {}, {}
    for name in names:
        model = build_model(*case_of(name))
        initial[name] = model.get_weights()
        trainable[name] = [v.trainable for v in model.weights]
        np.savez(f"{directory}/{_file(name)}_initial.npz", *initial[name])
        # The one-process reference: the same initial weights and seed, the full batch.
        losses = train(model, model, tokens, targets)
        reference[name] = (losses, model.get_weights(), seed_states(model))

    torch.multiprocessing.spawn(rank_main, args=(2, directory, names), nprocs=2, join=True)
    ranks = []
    for rank in range(2):
        with open(f"{directory}/rank{rank}.pickle", "rb") as f:
            ranks.append(pickle.load(f))

    def check(name):
        losses, weights, seeds = reference[name]
        for a, b in zip(ranks[0][name][1], ranks[1][name][1]):
            np.testing.assert_array_equal(a, b, err_msg=name)
        for rank in ranks:
            rank_losses, rank_weights, rank_seeds = rank[name]
            assert_same_training(name, initial[name], weights, rank_weights, losses, rank_losses, trainable[name])
            np.testing.assert_array_equal(rank_seeds, seeds, err_msg=name)
        np.testing.assert_array_equal(seeds, [[1, STEPS]] if name.startswith("yoso") else [])
        print(" ", name, ranks[0][name][0], losses)

    run_cases({name: lambda name=name: check(name) for name in names}, names)


if __name__ == "__main__":
    main(sys.argv[1:])
