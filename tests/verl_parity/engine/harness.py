"""What the engine conformance tests share: configs, verl batches, the three trainers, the checks.

The same RL batches (``make_step_batch``: left-padded prompts, right-padded responses of varied
lengths) train three ways for ``STEPS`` steps, one mini-batch (one optimizer step) per RL step:

- ``engine``: repro's DeepSpeed engine driven only through verl's engine API (``EngineRegistry.new``,
  ``train_mode``, ``train_batch``, ``lr_scheduler_step``), on verl TensorDicts in the NO_PADDING
  layout (``left_right_2_no_padding``), with verl's own ``ppo_loss`` / ``value_loss``;
- ``worker``: repro's own ``ActorWorker`` / ``CriticWorker`` on the padded batch (same DeepSpeed);
- ``Reference``: one process, plain PyTorch AdamW on the whole mini-batch, left-padded forward.

Error model of the checks (``tests/error_model.py``). Everything is fp32 and the three differ in
summation order only (packed vs padded attention, micro-batch split, gloo's all-reduce of two
halves, verl's vs repro's loss code): two such evaluations differ by at most eps x n x M, with n
the longest accumulation chain (the toy decoder's, ``toy_chain``, with the LoRA adapters' sums,
plus the step's tokens) and M the compared values' size. A grad norm also sums every parameter's
square (n grows by the parameter count). Parameters are compared with AdamW at ``eps = 1``: the
update ``lr * m / (sqrt(v) + eps)`` then moves by at most ``2 lr / eps`` per unit of gradient
difference (``ADAM_GAIN``), so each step adds that times the gradient bound, plus one rounding of
the parameter; a wrong gradient (2x, or half a rank's micro-batch missing) moves parameters by
~``lr * |g|`` ~ 1e-4 or more. With Adam's default eps=1e-8 a 1e-12 gradient near zero would flip a
whole ``lr`` step, which no parameter check below the learning rate survives.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from tests.distributed.workers.helpers import (
    ADAM_GAIN,
    Reference,
    make_cfg,
    make_step_batch,
    shard,
    toy_chain,
)
from tests.error_model import FP32_EPS, fp32_tol

STEPS = 3
SAMPLES = 8
"""One RL step's samples over both ranks (train_batch_size 4 x n 2), one mini-batch."""
MICRO = 2
MAX_TOKENS = 20
"""Dynamic micro-batch token budget per rank (sequences are 3..12 tokens)."""
LR = 1e-2
EPS = 1.0
SEED = 7
PROMPT_LEN = 6
LORA_TARGETS = ["q_proj", "v_proj"]
"""Two adapted projections per layer: the LoRA path whole, at a fraction of all-linear's ZeRO-3 hooks."""
SEQ = PROMPT_LEN + 6  # make_step_batch: prompts up to 6 tokens, responses up to 6
TERMS = toy_chain(SEQ, lora_rank=4) + SAMPLES * SEQ
"""The longest accumulation chain of any case (the LoRA actor's, rank 4) plus the step's tokens."""


def loss_tol(want: float) -> float:
    return fp32_tol(TERMS, max(abs(want), 1.0))


def norm_tol(want: float, n_params: int) -> float:
    return fp32_tol(TERMS + n_params, want)


def grads_tol(grads: dict[str, torch.Tensor]) -> float:
    return fp32_tol(TERMS, max(float(g.abs().max()) for g in grads.values()))


def forward_tol(values: torch.Tensor) -> float:
    return fp32_tol(toy_chain(SEQ, lora_rank=4), float(values.abs().max()))


def params_tol(norms: list[float], params: dict[str, torch.Tensor]) -> float:
    """After one update per grad norm in ``norms`` (each bounds the largest gradient element)."""
    p_max = max(float(p.abs().max()) for p in params.values())
    return sum(ADAM_GAIN * LR / EPS * fp32_tol(TERMS, n) + FP32_EPS * p_max for n in norms)



def run_cfg(model_dir: str, world: int, stage: int, *, dynamic: bool = False, lora_rank: int = 0,
            cosine: bool = False, offload: bool = False):
    """repro's RunConfig of the same run (the workers' and the Reference's)."""
    cfg = make_cfg(model_dir, world=world, stage=stage, micro=MICRO, mini=SAMPLES // 2, dynamic=dynamic,
                   max_tokens=MAX_TOKENS, lr=LR, use_kl_loss=True, offload="cpu" if offload else "none",
                   param_offload=offload and stage == 3)
    cfg.trainer.seed = SEED
    for section in (cfg.actor_rollout_ref.actor, cfg.critic):
        section.optim.eps = EPS
        if cosine:
            section.optim.warmup_style, section.optim.lr_warmup_steps = "cosine", 1
            section.optim.total_training_steps, section.optim.min_lr_ratio = STEPS, 0.1
    cfg.actor_rollout_ref.model.lora_rank = lora_rank
    cfg.actor_rollout_ref.model.lora_alpha = 8
    cfg.actor_rollout_ref.model.target_modules = LORA_TARGETS
    return cfg


def verl_configs(model_dir: str, stage: int, role: str, *, dynamic: bool = False, lora_rank: int = 0,
                 remove_padding: bool = True, forward_only: bool = False,
                 step_each_micro: bool | None = None, sp: int = 1, cosine: bool = False,
                 offload: bool = False, compile_layers: str = "off") -> tuple[Any, Any]:
    """(role config, model config) as verl's trainer would build them for ``model_engine=deepspeed``."""
    from verl.workers.config import HFModelConfig

    from repro.integrations.verl.config import (
        DeepSpeedActorConfig,
        DeepSpeedCriticConfig,
        DeepSpeedEngineConfig,
        DeepSpeedOptimizerConfig,
    )

    ds = DeepSpeedEngineConfig(zero_stage=stage, model_dtype="float32", torch_adam=True, seed=SEED,
                               use_dynamic_bsz=dynamic, max_token_len_per_gpu=MAX_TOKENS,
                               micro_batch_size_per_gpu=MICRO, use_remove_padding=remove_padding,
                               forward_only=forward_only, step_each_micro=step_each_micro,
                               ulysses_sequence_parallel_size=sp, offload="cpu" if offload else "none",
                               param_offload=offload and stage == 3, compile_layers=compile_layers)
    schedule = dict(lr_scheduler_type="cosine", lr_warmup_steps=1, total_training_steps=STEPS,
                    min_lr_ratio=0.1) if cosine else {}
    optim = DeepSpeedOptimizerConfig(lr=LR, eps=EPS, weight_decay=0.01, clip_grad=1.0, **schedule)
    common = dict(ppo_mini_batch_size=SAMPLES, use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=MAX_TOKENS,
                  ppo_micro_batch_size_per_gpu=None if dynamic else MICRO, loss_agg_mode="token-mean",
                  optim=optim, deepspeed=ds, shuffle=False)
    if role == "critic":
        section = DeepSpeedCriticConfig(cliprange_value=0.5, **common)
    else:
        section = DeepSpeedActorConfig(rollout_n=1, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
                                       use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="low_var_kl", **common)
    model = HFModelConfig(path=model_dir, load_tokenizer=False, use_remove_padding=remove_padding,
                          lora_rank=lora_rank, lora_alpha=8, target_modules=LORA_TARGETS)
    return section, model


def to_tensordict(batch: dict[str, torch.Tensor], section: Any, *, remove_padding: bool = True):
    """A rank's padded shard -> the TensorDict verl's engine workers hand an engine (NO_PADDING)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    n = batch["input_ids"].shape[0]
    td = TensorDict({**batch, "prompts": batch["input_ids"][:, :PROMPT_LEN]}, batch_size=[n])
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, use_dynamic_bsz=section.use_dynamic_bsz, max_token_len_per_gpu=MAX_TOKENS,
                         micro_batch_size_per_gpu=MICRO, use_remove_padding=remove_padding, temperature=1.0,
                         global_batch_size=SAMPLES, calculate_entropy=False)
    return td


def new_engine(model_dir: str, stage: int, role: str, **kw: Any) -> tuple[Any, Any]:
    """(engine, loss function) built the way verl's TrainingWorker builds them."""
    from verl.workers.engine import EngineRegistry
    from verl.workers.utils.losses import ppo_loss, value_loss

    import repro.integrations.verl  # noqa: F401  (verl's plugin loader imports it; here explicitly)

    repro_plugin().register()
    section, model = verl_configs(model_dir, stage, role, **kw)
    engine = EngineRegistry.new(model_type="value_model" if role == "critic" else "language_model",
                                backend=section.engine.strategy, model_config=model, engine_config=section.engine,
                                optimizer_config=section.optim, checkpoint_config=section.checkpoint)
    engine.initialize()
    return engine, functools.partial(value_loss if role == "critic" else ppo_loss, section)


def repro_plugin():
    import repro.integrations.verl as plugin

    return plugin


def capture_grads(engine: Any, into: dict) -> None:
    """Read the full gradient of every trainable parameter just before DeepSpeed's step (once)."""
    from deepspeed.utils import safe_get_full_grad

    def hook(role: Any) -> None:
        if not into:
            for name, p in role.module.named_parameters():
                if p.requires_grad:
                    into[name] = safe_get_full_grad(p).detach().float().cpu().clone()

    engine.role.before_step = hook


def engine_steps(engine: Any, loss_fn: Any, rank: int, world: int, *, remove_padding: bool = True,
                 steps: range = range(STEPS), save: tuple[int, str] | None = None) -> list[dict]:
    """verl's TrainingWorker.train_batch, step by step: loss (this rank's share) and grad norm.

    ``save=(n, folder)``: ``engine.save_checkpoint(folder, global_step=n)`` after the n-th step.
    """
    out = []
    # The ranks of a Ulysses group are one data-parallel rank: they get the same shard.
    dp_rank, dp = engine.get_data_parallel_rank(), engine.get_data_parallel_size()
    for step in steps:
        td = to_tensordict(shard(make_step_batch(100 + step, SAMPLES), dp_rank, dp), engine.engine_config,
                           remove_padding=remove_padding)
        lr = engine.role.current_lr() if hasattr(engine, "role") else None  # the LR of this step's update
        with engine.train_mode():
            result = engine.train_batch(td, loss_function=loss_fn)
        engine.lr_scheduler_step()
        # verl reports the grad norm on the first rank of a Ulysses group only (is_mp_src_rank_with_outputs).
        norm = result["metrics"].get("grad_norm")
        out.append({"loss": float(sum(result["loss"])), "grad_norm": None if norm is None else float(norm), "lr": lr})
        if save is not None and step + 1 == save[0]:
            engine.save_checkpoint(save[1], global_step=save[0])
    return out


def infer_log_probs(engine: Any, rank: int, world: int, *, base: bool = False) -> torch.Tensor:
    """verl's compute_log_prob path: ``eval_mode`` + ``infer_batch`` (no loss) on step 1's batch,
    the response log-probs ``[b, R]`` (0 off the mask); ``base``: under ``disable_adapter``."""
    import contextlib

    from verl.workers.utils.padding import no_padding_2_padding

    batch = shard(make_step_batch(100, SAMPLES), rank, world)
    td = to_tensordict(batch, engine.engine_config)
    with engine.eval_mode(), engine.disable_adapter() if base else contextlib.nullcontext():
        out = engine.infer_batch(td)
    lp = no_padding_2_padding(out["model_output"]["log_probs"], td)
    return (lp * batch["response_mask"]).float().cpu()


def reference_log_probs(model_dir: str) -> torch.Tensor:
    """The untrained model's response log-probs on step 1's whole batch (one process, left-padded)."""
    from transformers import AutoModelForCausalLM

    from repro.workers.logprob import token_log_probs

    batch = make_step_batch(100, SAMPLES)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    r = batch["responses"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, -r - 1:-1]
        lp, _ = token_log_probs(logits, batch["responses"])
    return lp * batch["response_mask"]


def full_params(engine_or_worker: Any) -> dict[str, torch.Tensor]:
    """Full (merged, for LoRA) parameters with HF names: the engine's rollout export, or the worker's."""
    if hasattr(engine_or_worker, "get_per_tensor_param"):
        gen, _ = engine_or_worker.get_per_tensor_param()
    else:
        gen = engine_or_worker.iter_full_weights()
    return {name: t.detach().float().cpu().clone() for name, t in gen}


def worker_steps(worker: Any, role: str, rank: int, world: int) -> list[dict]:
    out = []
    for step in range(STEPS):
        batch = shard(make_step_batch(100 + step, SAMPLES), rank, world)
        m = worker.update_policy(batch) if role != "critic" else worker.update_critic(batch)
        key = "critic" if role == "critic" else "actor"
        out.append({"loss": m[f"{key}/vf_loss" if role == "critic" else f"{key}/pg_loss"],
                    "grad_norm": m[f"{key}/grad_norm"], "lr": m[f"{key}/lr"]})
    return out


class LoraReference(Reference):
    """The Reference with the LoRA actor built as the engine builds it (same seed, same calls)."""

    def __init__(self, cfg: Any) -> None:
        from repro.workers import lora
        from repro.workers.engine import load_hf_model

        self.cfg, self.role, self.section = cfg, "actor", cfg.actor_rollout_ref.actor
        torch.manual_seed(SEED)
        self.model = lora.wrap(load_hf_model(cfg.actor_rollout_ref.model, torch.float32), cfg.actor_rollout_ref.model)
        o = self.section.optim
        self.opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=o.lr,
                                     betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
        self.model.train()

    def grads(self, mini: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        self.opt.zero_grad()
        self.loss(mini).backward()
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def params(self) -> dict[str, torch.Tensor]:
        from repro.workers import lora

        return {n: t.float().clone() for n, t in lora.merged_weights(self.model, zero3=False)}


def reference_run(cfg: Any, role: str, init: dict[str, torch.Tensor] | None, lora_rank: int = 0,
                  world: int = 2) -> tuple[list[dict], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Single-process steps on whole mini-batches: per-step (loss, grad norm), step-1 grads, final params."""
    from tests.distributed.workers.helpers import global_mini_batches

    ref = LoraReference(cfg) if lora_rank else Reference(cfg, "critic" if role == "critic" else "actor")
    if init is not None and not lora_rank:
        ref.set_weights(init)
    steps, grads = [], None
    for step in range(STEPS):
        (mini,) = global_mini_batches(make_step_batch(100 + step, SAMPLES), world, SAMPLES // world)
        if grads is None:
            grads = {n: g for n, g in ref.grads(mini).items()}
        loss, norm = ref.update(mini)
        steps.append({"loss": loss, "grad_norm": norm})
    return steps, grads, ref.params()


def assert_close(name: str, got: float, want: float, tol: float) -> None:
    assert abs(got - want) <= tol, f"{name}: {got!r} vs {want!r} (|diff| {abs(got - want):.3g} > {tol})"


def assert_params_close(name: str, got: dict, want: dict, tol: float) -> None:
    assert got.keys() == want.keys(), f"{name}: parameter names differ: {sorted(got.keys() ^ want.keys())[:5]}"
    worst = max(got, key=lambda k: float((got[k] - want[k]).abs().max()))
    diff = float((got[worst] - want[worst]).abs().max())
    assert diff <= tol, f"{name}: parameter {worst} differs by {diff:.3g} > {tol}"


def assert_steps_close(name: str, got: list[dict], want: list[dict], n_params: int, scale: float = 1.0) -> None:
    """Loss and grad norm per step; ``scale`` 2 compares two runs each within the bound of a third."""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(f"{name} step {i + 1} loss", g["loss"], w["loss"], scale * loss_tol(w["loss"]))
        assert_close(f"{name} step {i + 1} grad_norm", g["grad_norm"], w["grad_norm"],
                     scale * norm_tol(w["grad_norm"], n_params))


def new_fsdp2_engine(model_dir: str) -> tuple[Any, Any]:
    """verl's own FSDP2 engine on the same actor run, on CPU ranks (gloo).

    verl registers it for cuda and npu only, so ``EngineRegistry.new`` has none on a CPU host; the
    class it would return on CUDA is built directly. fp32 everywhere, sdpa attention (no flash-attn
    on CPU), AdamW eps as above (``override_optimizer_config``); verl's CPU platform comes from the
    plugin (``repro.integrations.verl.platform``).
    """
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.utils.losses import ppo_loss

    repro_plugin().register()
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    engine_config = FSDPEngineConfig(strategy="fsdp2", model_dtype="fp32", mixed_precision=fp32, seed=SEED,
                                     use_torch_compile=False, use_dynamic_bsz=False, micro_batch_size_per_gpu=MICRO,
                                     max_token_len_per_gpu=MAX_TOKENS)
    optim = FSDPOptimizerConfig(lr=LR, clip_grad=1.0, weight_decay=0.01, override_optimizer_config={"eps": EPS})
    model = HFModelConfig(path=model_dir, load_tokenizer=False, use_remove_padding=True,
                          override_config={"attn_implementation": "sdpa"})
    engine = FSDPEngineWithLMHead(model_config=model, engine_config=engine_config, optimizer_config=optim,
                                  checkpoint_config=CheckpointConfig())
    engine.initialize()
    section, _ = verl_configs(model_dir, 2, "actor")
    return engine, functools.partial(ppo_loss, section)


# repro's yamls on verl's Hydra search path, as a verl user's command line adds them.
SEARCHPATH = "hydra.searchpath=[pkg://repro.integrations.verl.hydra_config]"


def ref_as_verl_worker_builds_it(cfg: Any) -> Any:
    """The ref section as verl 0.9.1's ``ActorRolloutRefWorker.init_model`` hands it on: its ``log_prob_*``
    keys renamed to the engine's names (a DictConfig, before ``omega_conf_to_dataclass``)."""
    from omegaconf import open_dict

    ref = cfg.actor_rollout_ref.ref
    with open_dict(ref):
        ref.ppo_mini_batch_size = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
        ref.ppo_micro_batch_size = ref.pop("log_prob_micro_batch_size", None)
        ref.ppo_micro_batch_size_per_gpu = ref.pop("log_prob_micro_batch_size_per_gpu", None)
        ref.use_dynamic_bsz = ref.pop("log_prob_use_dynamic_bsz", False)
        ref.ppo_max_token_len_per_gpu = ref.pop("log_prob_max_token_len_per_gpu", None)
    return ref
