"""The peer benchmark's plumbing on CPU: its commands, its summary of a run, its table."""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.bench import peers
from repro.config.loader import load_config
from repro.config.peer_recipes import RECIPES


def _value(cfg: object, key: str) -> object:
    for part in key.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def _same(config_value: object, text: str) -> bool:
    """A config value against the command-line text it came from (yaml-ish: numbers, booleans, lists)."""
    import yaml

    parsed = yaml.safe_load(text)
    if isinstance(parsed, str) and isinstance(config_value, float):
        parsed = float(parsed)  # yaml 1.1 reads "1e-5" as a string
    return config_value == parsed or str(config_value) == text


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("peer", ["repro-zero2", "repro-zero3"])
def test_the_repro_peer_runs_every_key_of_its_recipe(recipe: str, peer: str, tmp_path: Path) -> None:
    r = RECIPES[recipe]
    policy, train = tmp_path / "policy", tmp_path / "train.parquet"
    cmd = peers.commands(peer, 30, policy, train, tmp_path / "val.parquet", tmp_path / peer, recipe_name=recipe)
    assert cmd[1:5] == ["-m", "repro.main_ppo", "-cn", r.preset]
    cfg = load_config([*cmd[5:], "trainer.dry_run=True"], config_name=r.preset)  # no vllm, no files here
    # Every key of the recipe (preset and equalisers) reaches the config, but for the ones the command
    # sets per run: the policy folder, the stage, the micro-batch and sleep flags (checked next).
    per_run = {"actor_rollout_ref.model.path", "actor_rollout_ref.actor.deepspeed.zero_stage", "trainer.total_training_steps",
               "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "actor_rollout_ref.rollout.free_cache_engine"}
    wrong = {k: (v, _value(cfg, k)) for k, v in r.values().items() if k not in per_run and not _same(_value(cfg, k), v)}
    assert wrong == {}
    actor = cfg.actor_rollout_ref.actor
    assert actor.deepspeed.zero_stage == int(peer[-1])
    assert cfg.trainer.n_gpus_per_node == r.gpus and cfg.trainer.total_training_steps == 30
    assert actor.ppo_micro_batch_size_per_gpu == r.micro
    assert cfg.actor_rollout_ref.rollout.free_cache_engine is r.vllm_sleep


def test_the_seed_recipe_is_the_seeds_preset_at_two_gpus_with_trls_vllm_batch() -> None:
    v = RECIPES["seed"].values()
    assert (v["data.train_batch_size"], v["actor_rollout_ref.rollout.n"], v["actor_rollout_ref.actor.ppo_mini_batch_size"]) == ("64", "4", "32")
    assert v["trainer.n_gpus_per_node"] == "2" and v["actor_rollout_ref.model.enable_gradient_checkpointing"] == "True"
    assert v["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "4096" and v["actor_rollout_ref.actor.use_dynamic_bsz"] == "True"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("micro,sleep", [(32, True), (64, False)])
def test_every_peer_is_given_the_same_micro_batch_and_vllm_sleep_setting(recipe: str, micro: int, sleep: bool,
                                                                          tmp_path: Path) -> None:
    for peer in peers.PEERS:
        cmd = peers.commands(peer, 5, tmp_path, tmp_path, tmp_path, tmp_path / peer, micro, sleep, recipe)
        if peer.startswith("repro-"):
            assert f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}" in cmd
            assert f"actor_rollout_ref.rollout.free_cache_engine={sleep}" in cmd
        else:
            assert cmd[cmd.index("--micro") + 1] == str(micro) and cmd[cmd.index("--recipe") + 1] == recipe
            assert ("--vllm-sleep" if sleep else "--no-vllm-sleep") in cmd
        if peer == "trl":
            # One process a GPU: torchrun on two.
            assert ("torch.distributed.run" in cmd) == (RECIPES[recipe].gpus > 1)


def test_verls_command_line_carries_the_micro_batch_and_sleep_setting(tmp_path: Path) -> None:
    from repro.integrations.verl.e2e import overrides

    args = overrides("dp", 3, tmp_path, tmp_path, tmp_path, tmp_path, 2, micro=32, vllm_sleep=False)
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32" in args
    assert "actor_rollout_ref.rollout.free_cache_engine=False" in args
    # verl has no trainer seed; the deepspeed keys go only to repro's engine.
    assert not any(a.startswith(("trainer.seed=", "actor_rollout_ref.actor.deepspeed.")) for a in args)
    assert "actor_rollout_ref.actor.deepspeed.zero_stage=3" in overrides("deepspeed", 3, tmp_path, tmp_path, tmp_path,
                                                                        tmp_path, 3, recipe="seed")


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_trls_config_is_read_off_repros_config_of_the_recipe(recipe: str) -> None:
    from repro.integrations.trl.peer import grpo_kwargs, rollout_optimizer_steps, vllm_max_num_seqs

    r = RECIPES[recipe]
    cfg = load_config([*r.overrides, "trainer.dry_run=True"], config_name=r.preset)
    kw = grpo_kwargs(cfg, r.gpus, r.micro, r.vllm_sleep, steps=10)
    actor, rollout = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    samples, mini = cfg.data.train_batch_size * rollout.n, actor.ppo_mini_batch_size * rollout.n
    # One generation is one rollout step's samples; one optimizer step is one mini-batch.
    assert kw["per_device_train_batch_size"] * r.gpus * kw["steps_per_generation"] == samples
    assert kw["per_device_train_batch_size"] * r.gpus * kw["gradient_accumulation_steps"] == mini
    assert kw["max_steps"] == 10 * rollout_optimizer_steps(cfg) == 10 * actor.ppo_epochs * samples // mini
    assert (kw["num_generations"], kw["num_iterations"], kw["max_completion_length"]) == \
        (rollout.n, actor.ppo_epochs, cfg.data.max_response_length)
    assert kw["top_k"] == 0  # off, as verl's -1
    assert (kw["learning_rate"], kw["epsilon"], kw["max_grad_norm"], kw["beta"]) == (actor.optim.lr, 0.2, 1.0, 0.0)
    assert kw["vllm_gpu_memory_utilization"] == rollout.gpu_memory_utilization
    assert kw["gradient_checkpointing"] is cfg.actor_rollout_ref.model.enable_gradient_checkpointing
    assert kw["deepspeed"]["zero_optimization"]["stage"] == actor.deepspeed.zero_stage
    if recipe == "seed":
        # TRL sizes vLLM's batch itself; the recipe gives repro and verl the same number.
        assert vllm_max_num_seqs(kw) == rollout.max_num_seqs == 128


def test_trl_refuses_a_micro_batch_that_does_not_divide_a_gpus_share_of_the_mini_batch() -> None:
    from repro.integrations.trl.peer import grpo_kwargs

    r = RECIPES["seed"]
    cfg = load_config([*r.overrides, "trainer.dry_run=True"], config_name=r.preset)
    with pytest.raises(ValueError, match="must divide the mini-batch of 128"):
        grpo_kwargs(cfg, 2, 48, True, 10)


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
    assert "--micro 48: must divide the recipe's mini-batch of 128 samples a GPU" in capsys.readouterr().err
    assert peers.main(["--recipe", "seed", "--micro", "48"]) == 2
    assert "mini-batch of 64 samples a GPU" in capsys.readouterr().err


def test_an_unknown_peer_is_refused_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert peers.main(["--peers", "repro-zero2,deepspeed-chat"]) == 2
    err = capsys.readouterr().err
    assert "deepspeed-chat" in err and "verl-dp" in err


def test_python_m_repro_bench_peers_is_the_peer_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    from repro.bench.__main__ import main as bench_main

    assert bench_main(["peers", "--micro", "48"]) == 2
    assert "--micro 48: must divide" in capsys.readouterr().err


def test_a_peer_stopped_by_its_time_limit_keeps_its_steps_and_its_whole_process_group_goes(tmp_path: Path) -> None:
    # A peer that logs a step, starts a child that would outlive it, then hangs (as a Ray job can).
    script = tmp_path / "peer.py"
    pidfile = tmp_path / "child.pid"
    script.write_text(
        "import subprocess, sys, time\n"
        f"open({str(tmp_path / 'run' / 'metrics.tsv')!r}, 'w').write('step\\ttiming_s/step\\tcritic/score/mean\\n1\\t2.0\\t0.5\\n')\n"
        f"open({str(pidfile)!r}, 'w').write(str(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']).pid))\n"
        "time.sleep(60)\n")
    import sys

    result = peers._run("repro-zero2", [sys.executable, str(script)], tmp_path / "run", timeout=1.5, trl_pythonpath="", gpus=1)
    assert result["exit"] == "timeout" and result["steps"] == 1 and result["score_step1"] == 0.5
    import os

    child = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the group was sent SIGTERM; give the child a moment to go
            os.kill(child, 0)
            import time

            time.sleep(0.1)
    assert (tmp_path / "run" / "peer.json").is_file()
