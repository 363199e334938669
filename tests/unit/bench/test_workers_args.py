"""The worker benchmark refuses an SP layout it cannot run before any rank starts."""

from __future__ import annotations

import pytest

from repro.bench import workers


@pytest.mark.parametrize("argv, part", [
    (["--sp", "2", "--runners", "worker,bare"], "--runners worker"),
    (["--sp", "3", "--nproc", "2", "--runners", "worker"], "divide --nproc=2"),
    (["--sp", "0", "--runners", "worker"], "--sp=0"),
])
def test_sp_the_bench_cannot_run_is_one_line_and_exit_2(argv, part, capsys, tmp_path):
    assert workers.main([*argv, "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --sp=") and part in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # refused before the model folder is written


def test_the_narrow_shape_keeps_what_sets_the_0p6b_host_op_count():
    # --host-ops on a CPU stands in for the 0.6B's count: depth, norms, GQA ratio and vocabulary equal
    from repro.bench.shapes import model_config

    full, narrow = model_config("qwen3-0.6b"), model_config("qwen3-0.6b-narrow")
    keep = ("num_hidden_layers", "vocab_size", "tie_word_embeddings", "rms_norm_eps", "max_position_embeddings")
    assert {k: getattr(narrow, k) for k in keep} == {k: getattr(full, k) for k in keep}
    assert (narrow.num_attention_heads // narrow.num_key_value_heads
            == full.num_attention_heads // full.num_key_value_heads)
    assert narrow.hidden_size < full.hidden_size


@pytest.mark.parametrize("case", list(workers.CASES))
def test_every_case_builds_the_deepspeed_json_it_names(case):
    # A case is its DeepSpeed section: the overlap cases reach DeepSpeed's JSON with overlap and their bucket,
    # the others leave overlap_comm to DeepSpeed's default (the engine reads it back: test_placement.py).
    from argparse import Namespace

    from repro.config.ds_config import build_ds_config
    from repro.config.plan import role_batch_plan

    args = Namespace(micro=2, gas=4, seq=64, no_gradient_checkpointing=False, sp=1)
    cfg = workers._run_config("/nonexistent", case, args, world=2)
    actor = cfg.actor_rollout_ref.actor
    zero = build_ds_config(actor.deepspeed, actor.optim, role_batch_plan(cfg, "actor"), grad_clip=1.0,
                           on_cuda=True)["zero_optimization"]
    want = workers.CASES[case]
    assert zero["stage"] == want["zero_stage"]
    assert zero.get("overlap_comm") == want.get("overlap_comm")
    assert zero.get("memory_efficient_linear") == want.get("memory_efficient_linear")
    if "reduce_bucket_size" in want:
        assert zero["reduce_bucket_size"] == want["reduce_bucket_size"]
