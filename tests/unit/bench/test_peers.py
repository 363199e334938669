"""The peer benchmark's plumbing on CPU: its commands, its summary of a run, its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.bench import peers
from repro.config.loader import load_config


@pytest.mark.parametrize("peer", ["repro-zero2", "repro-zero3"])
def test_the_repro_peers_command_is_one_the_config_loader_accepts(peer: str, tmp_path: Path) -> None:
    policy, train = tmp_path / "policy", tmp_path / "train.parquet"
    cmd = peers.commands(peer, 30, policy, train, tmp_path / "val.parquet", tmp_path / peer)
    assert cmd[1:5] == ["-m", "repro.main_ppo", "-cn", "grpo_tiny"]
    cfg = load_config([*cmd[5:], "trainer.dry_run=True"], config_name="grpo_tiny")  # no vllm, no files here
    actor = cfg.actor_rollout_ref.actor
    assert actor.deepspeed.zero_stage == int(peer[-1])
    # The recipe every peer shares (the TRL and verl peers state the same numbers in their keys).
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n, cfg.data.max_response_length) == (32, 8, 12)
    assert (actor.ppo_epochs, actor.ppo_mini_batch_size, actor.optim.lr, actor.clip_ratio) == (2, 16, 1e-4, 0.2)
    assert cfg.actor_rollout_ref.rollout.name == "vllm"
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == peers.UTIL
    assert cfg.trainer.total_training_steps == 30
    # The settings every peer gets alike: one micro-batch per mini-batch, vLLM awake throughout.
    assert actor.ppo_micro_batch_size_per_gpu == peers.MINI_BATCH
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is False
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is False


@pytest.mark.parametrize("micro,sleep", [(32, True), (128, False)])
def test_every_peer_is_given_the_same_micro_batch_and_vllm_sleep_setting(micro: int, sleep: bool, tmp_path: Path) -> None:
    for peer in peers.PEERS:
        cmd = peers.commands(peer, 5, tmp_path, tmp_path, tmp_path, tmp_path / peer, micro, sleep)
        if peer.startswith("repro-"):
            assert f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}" in cmd
            assert f"actor_rollout_ref.rollout.free_cache_engine={sleep}" in cmd
        else:
            assert cmd[cmd.index("--micro") + 1] == str(micro)
            assert ("--vllm-sleep" if sleep else "--no-vllm-sleep") in cmd
        if peer.startswith(("repro-", "verl-")):
            # verl's model config checkpoints activations unless told not to; TRL's peer sets it off itself.
            assert "actor_rollout_ref.model.enable_gradient_checkpointing=False" in cmd


def test_verls_command_line_carries_the_micro_batch_and_sleep_setting(tmp_path: Path) -> None:
    from repro.integrations.verl.e2e import overrides

    args = overrides("dp", 3, tmp_path, tmp_path, tmp_path, tmp_path, 2, micro=32, vllm_sleep=False)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in args
    assert "actor_rollout_ref.rollout.free_cache_engine=False" in args


def _rows(step_s: list[float], scores: list[float]) -> list[dict[str, float]]:
    return [{"step": i + 1, "timing_s/step": s, "timing_s/gen": s / 4, "perf/total_num_tokens": 1000.0,
             "critic/score/mean": sc, "perf/max_memory_allocated_gb": 1.0 + i}
            for i, (s, sc) in enumerate(zip(step_s, scores, strict=True))]


def test_the_summary_leaves_out_the_first_step_and_takes_medians() -> None:
    # Step 1 (start-up, compilation) is 100x the others: a mean including it would be ~10x off.
    rows = _rows([100.0, 1.0, 2.0, 3.0, 1.0, 2.0], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    s = peers.summarize(rows)
    assert s["timing_s/step"] == 2.0
    assert s["timing_s/gen"] == 0.5
    assert s["tokens_per_s_per_gpu"] == 500.0
    assert s["max_memory_allocated_gb"] == 6.0
    assert s["score_step1"] == 0.1
    assert s["score_last5"] == pytest.approx(0.4)  # mean of 0.2..0.6
    assert peers.summarize(rows, gpus=2)["tokens_per_s_per_gpu"] == 250.0


def test_the_table_ranks_against_the_fastest_and_names_a_failed_peer() -> None:
    results = {"a": peers.summarize(_rows([9.0, 2.0, 2.0], [0.1, 0.2, 0.3])),
               "b": peers.summarize(_rows([9.0, 3.0, 3.0], [0.1, 0.2, 0.3])),
               "c": {"error": "exit 1, no metrics"}}
    lines = peers.table(results).splitlines()
    assert lines[2].startswith("| a | 3 | 2 |") and lines[2].endswith("| 1.00x |")
    assert lines[3].endswith("| 1.50x |")
    assert lines[4] == "| c | failed: exit 1, no metrics |"


def test_a_micro_batch_that_does_not_divide_the_mini_batch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert peers.main(["--micro", "48"]) == 2
    assert "--micro 48: must divide the recipe's mini-batch of 128" in capsys.readouterr().err


def test_an_unknown_peer_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert peers.main(["--peers", "repro-zero2,deepspeed-chat"]) == 2
    err = capsys.readouterr().err
    assert "deepspeed-chat" in err and "verl-dp" in err


def test_python_m_repro_bench_peers_is_the_peer_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    from repro.bench.__main__ import main as bench_main

    assert bench_main(["peers", "--micro", "48"]) == 2
    assert "--micro 48: must divide" in capsys.readouterr().err
