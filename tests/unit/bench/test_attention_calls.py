"""``python -m repro.bench.attention_calls``: its micro-batches are the worker's, its update sums, its refusals.

The timing itself needs a GPU (a spin kernel and CUDA events); it ran on one H200 in session 27
(``results/actor_update/README.md``)."""

from __future__ import annotations

import argparse

import pytest

from repro.batching.token_budget import min_micro_batches
from repro.bench import attention_calls
from repro.bench.rmpad import make_batch
from repro.bench.shapes import model_config


@pytest.mark.parametrize("budget", [32768, 16384, 4096])
def test_the_micro_batches_are_rmpads_batch_split_as_the_worker_splits_it(budget):
    args = argparse.Namespace(micro=16, gas=4, prompt=256, response=512, min_response=1, budget=budget)
    vocab = model_config("qwen3-0.6b").vocab_size
    lengths = make_batch(args, vocab)["attention_mask"].sum(1).tolist()
    bins = attention_calls.micro_batches(args, vocab)
    assert sorted(x for b in bins for x in b) == sorted(lengths)  # every sample once
    assert all(sum(b) <= budget for b in bins) and len(bins) == min_micro_batches(lengths, budget)


def test_form_cs_batch_is_one_micro_batch_of_26979_tokens():
    # the figure results/actor_update/README.md gives form C (64 samples in one 32,768-token micro-batch)
    args = argparse.Namespace(micro=16, gas=4, prompt=256, response=512, min_response=1, budget=32768)
    (only,) = attention_calls.micro_batches(args, model_config("qwen3-0.6b").vocab_size)
    assert (sum(only), len(only)) == (26979, 64)


def test_an_updates_figures_are_every_layers_forward_and_backward_of_every_micro_batch():
    rows = [{"impl": "fa4", "kernels": "repro_fa4", "host_us": h, "device_us": d, "held": True}
            for h, d in ((100.0, 50.0), (200.0, 400.0), (300.0, 60.0), (400.0, 500.0))]  # two micro-batches
    (line,) = attention_calls.summary(rows, layers=28)
    assert "28 layers x 2 micro-batches" in line
    assert "issue in 28.0 ms of host time, run in 28.3 ms on the GPU" in line  # 28 x 1000 us, 28 x 1010 us


def test_a_cpu_process_gets_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # a CPU process on any machine, the GPU machine's CPU suites too
    assert attention_calls.main([]) == 2
    assert capsys.readouterr().err.strip() == ("error: repro.bench.attention_calls times CUDA kernels; this process "
                                               "runs on CPU (no CUDA device, or DS_ACCELERATOR=cpu)")


def test_an_unknown_kernel_set_names_the_flag_and_the_choices(capsys):
    assert attention_calls.main(["--impls", "torch,fa3"]) == 2
    assert capsys.readouterr().err.strip() == "error: --impls 'fa3' is not valid; choose from ['torch', 'fa4']"
