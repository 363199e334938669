"""The one-GPU tools behind results/verl_engine/, run where they can be here (CPU, the tiny shape)."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro.integrations.verl import compare, e2e
from tests.seed_scale_phase import run_phase


def test_compare_builds_fsdp2_and_the_deepspeed_cases_and_holds_them_to_verls_bar(tmp_path, monkeypatch):
    # The cases run on CPU ranks. On a machine with a GPU verl registers its FSDP engine for the
    # device it detects (cuda) while the CPU platform asks for cpu: the case processes must not see it.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # fp32 on CPU: the three engines do the same arithmetic up to summation order, far inside the bar.
    rc = compare.main(["--shape", "tiny", "--steps", "2", "--out", str(tmp_path)])
    assert rc == 0, "\n".join(f"{log.name}: {log.read_text()[-1500:]}" for log in tmp_path.glob("*.log"))
    table = (tmp_path / "table.md").read_text()
    for case in compare.DEFAULT_CASES:
        assert f"| {case} | 2 |" in table
    results = {c: __import__("json").loads((tmp_path / f"{c}.json").read_text()) for c in compare.DEFAULT_CASES}
    assert compare.compare(results)[1] == []
    packed, padded = results["ds-zero2-rmpad"], results["ds-zero2"]
    assert packed["masked_forwards"] == 0 < packed["forwards"] and padded["masked_forwards"] == padded["forwards"] > 0
    broken = copy.deepcopy(results)
    broken["ds-zero2"]["steps"][0]["grad_norm"] *= 1.05  # outside rtol 3e-2
    broken["ds-zero3-leaf"]["steps"][0]["logprob"] += 0.5
    broken["ds-zero2-rmpad"]["masked_forwards"] = 1  # a packed case that still ran a padded forward
    failures = compare.compare(broken)[1]
    assert any("ds-zero2: step-1 grad norm" in f for f in failures)
    assert any("ds-zero3-leaf: step-1 logprob" in f for f in failures)
    assert any("ds-zero2-rmpad: 1 of" in f for f in failures)


def test_compare_fails_a_gpu_case_whose_engine_did_not_attend_as_asked():
    """On a GPU the packed cases' proof is what the engine reports: the varlen path, the asked-for kernels, compiled
    layers. Results as a GPU run writes them, each with one thing missing."""
    from repro.workers.varlen import FLASH_IMPLS

    good = {"cuda": True, "varlen": True, "flash_attention": FLASH_IMPLS["fa4"], "compiled_layers": 28,
            "masked_forwards": 0, "forwards": 8, "engine_line": "..."}
    case = "ds-zero2-rmpad-fa4-compiled"
    assert compare.engagement_failures(case, good) == []
    assert compare.engagement_failures(case, {**good, "cuda": False, "varlen": False}) == []  # CPU: sdpa's mask path
    for broken, words in (({"varlen": False}, "not attended through the varlen path"),
                          ({"flash_attention": "torch"}, "flash kernels 'torch'"),
                          ({"compiled_layers": 0}, "no compiled layer")):
        assert any(words in f for f in compare.engagement_failures(case, {**good, **broken})), broken
    assert compare.engagement_failures("ds-zero2-rmpad", {**good, "flash_attention": "torch", "compiled_layers": 0}) == []


def test_compare_refuses_a_case_list_without_the_baseline(tmp_path, capsys):
    assert compare.main(["--cases", "ds-zero2", "--out", str(tmp_path)]) == 2
    assert "fsdp2" in capsys.readouterr().err


def test_e2e_reads_verls_console_lines_and_checks_the_rise():
    lines = [f"(TaskRunner pid=1) step:{i} - actor/pg_loss:-0.01 - critic/score/mean:{0.3 + 0.01 * i} - "
             f"timing_s/step:{5 + i % 2}.5" for i in range(1, 11)] + ["step:3 - no score here"]
    rows = e2e.parse_console("\n".join(lines))
    assert [r["step"] for r in rows] == list(range(1, 11))
    summary = e2e.summarize(rows)
    assert abs(summary["score_step1"] - 0.31) < 1e-9 and abs(summary["rise"] - 0.07) < 1e-9
    assert summary["rise"] < e2e.MARGIN  # a 0.07 rise fails the gate's margin


def test_e2e_prints_each_steps_score_and_times_however_long_verls_line():
    balance = " - ".join(f"global_seqlen/k{i}:{i}.0" for i in range(60))  # verl's line leads with these
    line = (f"(TaskRunner pid=1) step:13 - {balance} - critic/score/mean:0.9531 - timing_s/step:19.84 - "
            "timing_s/update_actor:12.8 - actor/perf/max_memory_allocated_gb:6.81")  # verl's names (results/4gpu)
    (row,) = e2e.parse_console(line)
    assert e2e.step_line(row) == "step 13: score 0.9531, s/step 19.84, update 12.8, actor max allocated GB 6.81"


def test_e2e_composes_verls_trainer_config_with_the_deepspeed_engine(tmp_path):
    out = subprocess.run([sys.executable, "-m", "repro.integrations.verl.e2e", "--print-config", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "strategy: deepspeed" in out.stdout and "_target_: repro.integrations.verl.config.DeepSpeedActorConfig" in out.stdout
    assert "repro/integrations/verl/reward.py" in out.stdout


def test_the_reward_verl_calls_is_repros_rule_for_the_rows_data_source():
    from repro.integrations.verl.reward import compute_score

    assert compute_score("repro/arith", "Q: 23+4=? A: #### 27", "27") == 1.0
    assert compute_score("repro/arith", "#### 28", "27") == 0.1  # formatted, wrong: grpo_tiny's format score
    assert compute_score("openai/gsm8k", "no answer", "27") == 0.0


def _at(tree, key: str):
    for part in key.split("."):
        tree = tree[part] if isinstance(tree, dict) else getattr(tree, part)
    return tree


@pytest.mark.parametrize("engine", ["dp", "deepspeed"])
def test_verls_trainer_is_given_every_key_of_the_seed_recipe_at_repros_value(engine, tmp_path):
    """The peer table's "equal settings", checked in the composed configs: for each key of the seed
    recipe (repro's preset and the recipe's own), verl's composed value equals what repro's trainer
    runs with in the peer benchmark, but for the keys verl lacks (e2e.REPRO_ONLY, each with its reason)."""
    import json

    import yaml

    from repro.bench import peers
    from repro.config.peer_recipes import RECIPES

    recipe = RECIPES["seed"]
    out = subprocess.run([sys.executable, "-m", "repro.integrations.verl.e2e", "--engine", engine, "--recipe", "seed",
                          "--print-config", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    verl = yaml.safe_load(out.stdout)
    cmd = peers.commands("repro-zero2", 30, tmp_path / recipe.policy, tmp_path, tmp_path, tmp_path / "repro", recipe_name="seed")
    # repro's config in a process of its own: its loader registers a Hydra schema named ppo_trainer, which
    # would stand in for verl's in this process's later compositions.
    code = ("import dataclasses, json, sys; from repro.config.loader import load_config; "
            "print(json.dumps(dataclasses.asdict(load_config(sys.argv[2:], config_name=sys.argv[1]))))")
    loaded = subprocess.run([sys.executable, "-c", code, recipe.preset, *cmd[5:], "trainer.dry_run=True"],
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    repro = json.loads(loaded.stdout.splitlines()[-1])
    compared, differ = 0, {}
    for key in recipe.values():
        if key in e2e.REPRO_ONLY or (engine == "dp" and key.startswith("actor_rollout_ref.actor.deepspeed.")) \
                or key == "trainer.experiment_name":  # a run's name (e2e names it by engine), not a setting
            continue
        verl_key = "reward.custom_reward_function." + key.removeprefix("reward.") if key.startswith("reward.reward_kwargs.") else key
        mine = _at(repro, key)
        theirs = _at(verl, verl_key)
        if key == "actor_rollout_ref.model.path":  # a folder each, named alike in --print-config
            mine, theirs = Path(mine).name, Path(theirs).name
        compared += 1
        if mine != theirs and not (isinstance(mine, list) and list(mine) == list(theirs)):
            differ[key] = (mine, theirs)
    assert differ == {}
    assert compared >= 35  # the preset's ~40 keys less the few repro-only ones: none skipped by accident


def _vfour_config(tmp_path):
    """verl's config as ``bash scripts/seed_scale.sh vfour 2 2 15`` composes it (the phase itself, with
    ``--print-config`` passed through to the e2e), as an OmegaConf tree."""
    import yaml
    from omegaconf import OmegaConf

    proc, out = run_phase(tmp_path, "vfour", "2", "2", "15", "--print-config", PYTHONWARNINGS="ignore")
    log = (out / "verl_vfour_zero2_sp2.log").read_text()
    assert proc.returncode == 0 and "rc=0" in proc.stdout, proc.stdout + log[-2000:]
    # The phase's log holds stderr too: verl's platform lines ("WARNING:<time>:...") among the yaml.
    return OmegaConf.create(yaml.safe_load("\n".join(line for line in log.splitlines()
                                                     if not re.match(r"(DEBUG|INFO|WARNING):\d", line))))


def test_the_four_gpu_verl_phase_composes_and_passes_verls_own_checks(tmp_path):
    """results/4gpu/'s next verl run, checked here: a key verl refuses at four GPUs costs a device session."""
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    cfg = _vfour_config(tmp_path)
    validate_config(config=cfg, use_reference_policy=False, use_critic=False)  # verl's own, n_gpus from the config
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    assert (cfg.trainer.n_gpus_per_node, cfg.data.train_batch_size, cfg.trainer.total_training_steps) == (4, 128, 15)
    assert (actor.strategy, actor.deepspeed.zero_stage, actor.deepspeed.ulysses_sequence_parallel_size) == ("deepspeed", 2, 2)
    assert (actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz) == (128, 16, False)
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_use_dynamic_bsz, rollout.enforce_eager) == (16, False, True)
    # The same check refuses what verl's trainer would: a mini-batch larger than the step's batch.
    cfg.data.train_batch_size = 64
    with pytest.raises(ValueError, match=r"train_batch_size \(64\) must be >= actor.ppo_mini_batch_size \(128\)"):
        validate_config(config=cfg, use_reference_policy=False, use_critic=False)
