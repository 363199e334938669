"""Named runs: override lists applied on top of ``ppo_trainer`` (``-cn grpo_tiny`` and friends).

``grpo_tiny`` is the embedded default job: GRPO of the warm-started tiny policy on the
arithmetic task, 2 ranks with ZeRO-2, in the recipe measured in shared/notes/tiny-policy-grpo.md
(32 prompts x 8 samples, temperature 1.0, 12 new tokens, lr 1e-4, 2 epochs x 2 mini-batches,
clip 0.2, grad clip 1.0, no KL). It runs on CPU ranks here and on GPUs where there are some.
``ppo_tiny`` is the same task with a critic and GAE. Later overrides on the command line win.
"""

from __future__ import annotations

_TINY_TASK = [
    "actor_rollout_ref.model.path=tiny",
    "data.train_batch_size=32",
    "data.max_prompt_length=16",
    "data.max_response_length=12",
    "data.seed=0",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.rollout.top_p=1.0",
    "actor_rollout_ref.rollout.top_k=-1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
    "actor_rollout_ref.actor.optim.lr=1e-4",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
    "actor_rollout_ref.actor.clip_ratio=0.2",
    "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.entropy_coeff=0.0",
    "actor_rollout_ref.actor.deepspeed.zero_stage=2",
    "algorithm.use_kl_in_reward=False",
    "reward.reward_kwargs.method=strict",
    "reward.reward_kwargs.format_score=0.1",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.total_training_steps=60",
    "trainer.test_freq=10",
    "trainer.val_before_train=True",
    "trainer.save_freq=20",
    "trainer.seed=1",
]

PRESETS: dict[str, list[str]] = {
    "grpo_tiny": _TINY_TASK + [
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=True",
        "critic.enable=False",
        "trainer.experiment_name=grpo_tiny_arith",
    ],
    "ppo_tiny": _TINY_TASK + [
        "algorithm.adv_estimator=gae",
        "algorithm.gamma=1.0",
        "algorithm.lam=1.0",
        "critic.enable=True",
        "critic.model.path=tiny",
        "critic.optim.lr=1e-4",
        "critic.ppo_epochs=2",
        "critic.ppo_mini_batch_size=16",
        "critic.ppo_micro_batch_size_per_gpu=64",
        "critic.forward_micro_batch_size_per_gpu=128",
        "critic.deepspeed_config.zero_stage=2",
        "trainer.experiment_name=ppo_tiny_arith",
    ],
}


def samples_per_mini_batch(name: str) -> int:
    """Samples in one mini-batch of preset ``name`` (prompts per mini-batch x samples per prompt):
    what the peer benchmark's micro-batches must divide, in every framework's keys."""
    values = dict(o.split("=", 1) for o in preset_overrides(name))
    return int(values["actor_rollout_ref.actor.ppo_mini_batch_size"]) * int(values["actor_rollout_ref.rollout.n"])


def preset_overrides(name: str) -> list[str]:
    """The overrides of preset ``name``; ``ValueError`` listing the presets otherwise."""
    try:
        return list(PRESETS[name])
    except KeyError:
        raise ValueError(f"config name {name!r} is not a preset; choose one of {sorted(PRESETS)} or ppo_trainer") from None
