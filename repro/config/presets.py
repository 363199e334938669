"""Named runs: override lists applied on top of ``ppo_trainer`` (``-cn grpo_tiny`` and friends).

``grpo_tiny`` is the embedded default job: GRPO of the warm-started tiny policy on the
arithmetic task, 2 ranks with ZeRO-2, in the recipe measured in shared/notes/tiny-policy-grpo.md
(32 prompts x 8 samples, temperature 1.0, 12 new tokens, lr 1e-4, 2 epochs x 2 mini-batches,
clip 0.2, grad clip 1.0, no KL). It runs on CPU ranks here and on GPUs where there are some.
``ppo_tiny`` is the same task with a critic and GAE.

``grpo_0p6b`` is the seed's 60-step GRPO reference command (``fixtures/pr_commands/grpo_fix_60.txt``)
at its own scale: the Qwen3-0.6B-shaped ``qwen3-0.6b-arith`` policy on the arithmetic task, 2 GPUs,
vLLM rollout, ZeRO-2, with the seed's keys (n=4, 64 prompts, mini-batch 32, micro 1, the 4096-token
budget, gradient checkpointing, remove padding, prompts 256 / responses 512, the flexible reward
with 0.1 for format, vLLM's 0.2 memory share, 8 sequences and 2048 batched tokens). Where it
departs from the seed, on purpose: the policy and the task (real weights cannot be downloaded on
the machines this suite proves itself on); learning rate 1e-5 instead of verl's default 1e-6 (the
seed's rate is for pretrained weights; this policy was SFT'd at 3e-4 a minute ago); validation every
10 steps on problems SFT never saw (the seed validated never); and ``use_dynamic_bsz`` for the update and
the log-prob pass, so the seed's 4096-token budget takes effect (verl ignores the budget without it, and
the seed's run then did micro-batches of one sample: 64 per rank per mini-batch, measured at 73-79 s a
step on 2 H100s against 5.2-6.9 s with the budget, results/seed_scale/README.md). Later overrides on the
command line win.
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


PRESETS["grpo_0p6b"] = [
    "actor_rollout_ref.model.path=qwen3-0.6b-arith",
    "algorithm.adv_estimator=grpo",
    "algorithm.norm_adv_by_std_in_grpo=True",
    "algorithm.use_kl_in_reward=False",
    "critic.enable=False",
    "reward.reward_kwargs.method=flexible",
    "reward.reward_kwargs.format_score=0.1",
    "reward.reward_kwargs.score=1.0",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.mode=async",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.max_model_len=1024",
    "actor_rollout_ref.rollout.max_num_seqs=8",
    "actor_rollout_ref.rollout.max_num_batched_tokens=2048",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.2",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.optim.lr=1e-5",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
    "actor_rollout_ref.actor.use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.actor.deepspeed.zero_stage=2",
    "actor_rollout_ref.actor.deepspeed.offload=none",
    "data.train_batch_size=64",
    "data.max_prompt_length=256",
    "data.max_response_length=512",
    "data.filter_overlong_prompts=True",
    "data.seed=0",
    "trainer.device=cuda",
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.total_training_steps=60",
    "trainer.test_freq=10",
    "trainer.val_before_train=True",
    "trainer.save_freq=-1",
    "trainer.seed=1",
    "trainer.experiment_name=grpo_0p6b_arith",
]


def preset_overrides(name: str) -> list[str]:
    """The overrides of preset ``name``; ``ValueError`` listing the presets otherwise."""
    try:
        return list(PRESETS[name])
    except KeyError:
        raise ValueError(f"config name {name!r} is not a preset; choose one of {sorted(PRESETS)} or ppo_trainer") from None
