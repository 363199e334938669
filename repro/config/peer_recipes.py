"""What every peer of ``python -m repro.bench.peers`` is given alike, at each scale (one place for all three).

A peer recipe is a preset (``repro.config.presets``) plus the keys that make every framework run the
same work: repro's trainer reads the preset and these keys; verl's trainer gets the same keys under
their own names (``repro.integrations.verl.e2e``, which translates the few repro-only ones); TRL's
``GRPOTrainer`` gets a ``GRPOConfig`` read off repro's config of the same recipe
(``repro.integrations.trl.peer``). So a setting is written once, here or in the preset.

- ``tiny``: ``grpo_tiny`` on one GPU (the 1 M-parameter policy): the table of results/peers/.
- ``seed``: ``grpo_0p6b`` on two GPUs (dp=2), the seed's scale: the Qwen3-0.6B-shaped policy, n=4, 64
  prompts, mini-batch 32, lr 1e-5, clip 0.2, KL off, activation checkpointing, the 4096-token budget,
  vLLM's 0.2 share asleep while the actor trains (verl's default). Departures from the preset, each
  because one peer cannot do otherwise: no remove-padding (verl's needs flash-attn, which the GPU
  image lacks; TRL pads); vLLM with CUDA graphs, 128 sequences and 4096 batched tokens (TRL fixes
  ``max_num_seqs`` to its per-device batch x ``steps_per_generation`` and ``max_num_batched_tokens``
  to 4096, and never passes ``enforce_eager``); no validation (the peers measure training steps).
"""

from __future__ import annotations

from dataclasses import dataclass

from repro.config.presets import preset_overrides


@dataclass(frozen=True)
class PeerRecipe:
    """One scale of the peer benchmark."""

    name: str
    preset: str
    """The repro preset whose keys every peer gets (``-cn`` of repro's trainer)."""
    policy: str
    """The built-in policy (``repro.data.policies``) every peer starts from."""
    gpus: int
    """GPUs of one host each peer runs on (data parallel over all of them)."""
    overrides: tuple[str, ...]
    """Keys on top of the preset, in repro's (= verl's) names."""
    micro: int
    """Samples per update micro-batch on one GPU where a peer counts them (TRL, and repro/verl when
    ``use_dynamic_bsz`` is off); with token budgets on it is what one budget holds at this task's lengths."""
    vllm_sleep: bool
    """vLLM sleep mode between generations (``free_cache_engine``; TRL's ``vllm_enable_sleep_mode``)."""

    def keys(self) -> list[str]:
        """The preset's overrides, then the recipe's (later ones win, as on a command line)."""
        return [*preset_overrides(self.preset), *self.overrides]

    def values(self) -> dict[str, str]:
        """Key -> value of :meth:`keys`, the last one winning."""
        return dict(k.split("=", 1) for k in self.keys())

    def mini_batch_per_gpu(self) -> int:
        """Samples of one mini-batch on one GPU: what a micro-batch must divide."""
        v = self.values()
        return int(v["actor_rollout_ref.actor.ppo_mini_batch_size"]) * int(v["actor_rollout_ref.rollout.n"]) // self.gpus


RECIPES = {
    "tiny": PeerRecipe(
        name="tiny", preset="grpo_tiny", policy="tiny", gpus=1,
        # Activation checkpointing off: verl's model config turns it on by default (repro's and TRL's leave
        # it off), and at this size it only adds a second forward.
        overrides=("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
                   "actor_rollout_ref.rollout.enforce_eager=True", "actor_rollout_ref.model.enable_gradient_checkpointing=False",
                   "actor_rollout_ref.actor.deepspeed.torch_adam=True", "trainer.n_gpus_per_node=1",
                   "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1"),
        micro=16 * 8, vllm_sleep=False),
    "seed": PeerRecipe(
        name="seed", preset="grpo_0p6b", policy="qwen3-0.6b-arith", gpus=2,
        overrides=("actor_rollout_ref.model.use_remove_padding=False", "actor_rollout_ref.rollout.enforce_eager=False",
                   "actor_rollout_ref.rollout.max_num_seqs=128", "actor_rollout_ref.rollout.max_num_batched_tokens=4096",
                   "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1"),
        # 32 prompts x 4 samples a mini-batch over 2 GPUs: 64 samples a GPU, ~21 tokens each on this task
        # (12-token prompts, ~9-token answers): one 4096-token budget holds them all.
        micro=64, vllm_sleep=True),
}


def recipe(name: str) -> PeerRecipe:
    """The recipe ``name``; ``ValueError`` listing the recipes otherwise."""
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"peer recipe {name!r}: choose one of {sorted(RECIPES)}") from None
