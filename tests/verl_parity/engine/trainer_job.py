"""verl 0.9.1's own trainer with repro's DeepSpeed engine, as a job on 2 CPU ranks.

``python -m verl.trainer.main_ppo model_engine=deepspeed ...`` (the command line of
``repro.integrations.verl.e2e``, shrunk: GRPO on repro's arithmetic task and tiny policy, 4 prompts x
2 samples a step, one mini-batch, ZeRO-2) with what a CPU host needs: ``trainer.device=cpu`` on 2
ranks, the legacy ``RayPPOTrainer`` (``trainer.use_v1=false``) and the canned rollout of
``tests/verl_parity/engine/canned_rollout.py`` in place of vLLM. verl checkpoints to
``<out>/ckpt/global_step_N`` (``trainer.save_freq``). The job runs through ``tests/jobs.py``
(:func:`tests.jobs.start`: a session of its own, stdout and stderr merged).
"""

from __future__ import annotations

import sys
from pathlib import Path

from repro.integrations.verl import SEARCHPATH
from tests import jobs

ROLLOUT_MODULE = "tests.verl_parity.engine.canned_rollout"
MODULES = f"repro.integrations.verl.plugin,{ROLLOUT_MODULE}"
"""What every process of the job imports with ``verl`` (``VERL_USE_EXTERNAL_MODULES``): repro's
engine (as the ``verl.plugins`` entry point would) and the canned rollout."""


def overrides(policy: Path, train: Path, val: Path, out: Path, *, steps: int, save_freq: int) -> list[str]:
    """verl's command line for the job (verl's keys)."""
    return [
        "model_engine=deepspeed", f"hydra.searchpath=[{SEARCHPATH}]",
        "trainer.use_v1=False", "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.nnodes=1",
        "ray_kwargs.ray_init.num_cpus=8", "+ray_kwargs.ray_init.num_gpus=2",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=4",
        "data.max_prompt_length=16", "data.max_response_length=6", "data.seed=0",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={policy}",
        "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0.0", "actor_rollout_ref.actor.deepspeed.zero_stage=2",
        f"actor_rollout_ref.rollout.name={'canned'}", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={ROLLOUT_MODULE}.CannedAgentLoopManager",
        "reward.num_workers=1",
        f"trainer.total_training_steps={steps}", "trainer.total_epochs=100", f"trainer.save_freq={save_freq}",
        "trainer.logger=[console]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.project_name=repro", "trainer.experiment_name=verl_cpu", f"trainer.default_local_dir={out / 'ckpt'}",
    ]


def command(out: Path, *, steps: int, save_freq: int) -> list[str]:
    """The job's command line, with the tiny policy and the arithmetic task prepared (cached)."""
    from repro.data.arith import ensure_arith_parquet
    from repro.data.sft import cache_root, ensure_tiny_policy

    train, val = ensure_arith_parquet(cache_root() / "arith")
    return [sys.executable, "-m", "verl.trainer.main_ppo",
            *overrides(ensure_tiny_policy(), train, val, out, steps=steps, save_freq=save_freq)]


def env(outputs: Path) -> dict[str, str]:
    """:func:`tests.jobs.job_env` (this checkout importable; ``REPRO_OUTPUTS_DIR`` names the job's
    processes) on a Ray cluster of the job's own, with the modules every verl process imports."""
    e = jobs.job_env(outputs)
    e.pop("RAY_ADDRESS", None)
    e.update(VERL_USE_EXTERNAL_MODULES=MODULES, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
    return e


def checkpoints(out: Path) -> list[str]:
    """The ``global_step_N`` folders verl wrote, in step order."""
    folder = out / "ckpt"
    if not folder.is_dir():
        return []
    return sorted((p.name for p in folder.iterdir() if p.name.startswith("global_step_")),
                  key=lambda n: int(n.rsplit("_", 1)[1]))


def lost_its_port(output: list[str]) -> bool:
    """Whether the job failed at start-up because its rendezvous port was taken: verl picks rank 0's
    port by binding port 0 and closing it (``get_master_addr_port``, verl/single_controller/ray/base.py),
    and on a shared machine another job may bind it before rank 0's store does (``EADDRINUSE``;
    seen once in about ten runs here). Nothing of the run had started then: a test may run it again."""
    return any("EADDRINUSE" in ln for ln in output) and not any("step:1 - " in ln for ln in output)
