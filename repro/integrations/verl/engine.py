"""repro's DeepSpeed engine behind verl's ``BaseEngine`` (backend ``deepspeed``).

The engine is a thin adapter: the DeepSpeed engine itself is repro's :class:`RoleEngine`
(``build_ds_config``, stage-aware offload, env knobs, ZeRO-3 leaf modules), the model comes from
``load_hf_model`` (LoRA by ``repro.workers.lora``, Ulysses by ``repro.workers.ulysses``), token
log-probs from the chunked ``token_log_probs``, and checkpoints from ``repro.workers.checkpoint``
inside a ``repro.run.checkpoints`` folder (manifest written last, verified before a load).

What is verl's: the batch (a TensorDict in verl's NO_PADDING layout, nested ``input_ids`` /
``position_ids``), its micro-batching (``prepare_micro_batches``: fixed or ``use_dynamic_bsz``,
the same micro-batch count on every dp rank), the loss functions (``verl.workers.utils.losses``)
and the output assembly (``postprocess_batch_func``). verl's losses divide by the *global* token
count and multiply by ``dp_size``; DeepSpeed averages gradients over the dp ranks, so the
accumulated gradient is the whole mini-batch's, for any split; the engine therefore backs each
micro-batch's loss with ``scale_wrt_gas=False`` and marks the accumulation boundary itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.base import BaseEngine, BaseEngineCtx, EngineRegistry
from verl.workers.engine.utils import detach_tree, postprocess_batch_func, prepare_micro_batches

from repro.batching.plan import RoleBatchPlan, data_parallel_size
from repro.cluster.process_group import init_distributed
from repro.integrations.verl import model_io
from repro.integrations.verl.checkpointing import load_engine, save_engine
from repro.integrations.verl.config import DeepSpeedEngineConfig, repro_model, repro_optim
from repro.integrations.verl.platform import use_cpu_platform_if_cpu
from repro.run import banner
from repro.workers import checkpoint, layer_compile, lora, ulysses, varlen
from repro.workers.engine import RoleEngine, load_hf_model, torch_dtype

DEVICES = ["cuda", "cpu"]


class _ModeCtx(BaseEngineCtx):
    """verl's train/eval context: load/offload around the mode (BaseEngineCtx), module mode, zero grad.

    The outermost train context of an actor engine is one actor update: verl's ``update_actor``
    (``TrainingWorker.train_mini_batch``) holds one around all of the step's mini-batches, each
    ``train_batch`` nests its own. Entering it counts the update and arms ``REPRO_FAULT_RANK``'s
    fault (``RoleEngine.arm_fault``), as repro's ``ActorWorker.update_policy`` does."""

    def __enter__(self) -> None:
        super().__enter__()
        engine = self.engine
        engine.role.module.train(self.mode == "train")
        if self.mode == "train":
            if engine._train_depth == 0 and not engine.value_head:
                engine.updates += 1
                engine.role.arm_fault(engine.updates)
            engine._train_depth += 1

    def __exit__(self, exc_type, exc_val, exc_tb) -> None:
        if self.mode == "train":
            self.engine._train_depth -= 1
            if self.zero_grad_on_exit or exc_type is not None:
                self.engine.optimizer_zero_grad()
        super().__exit__(exc_type, exc_val, exc_tb)


class DeepSpeedEngine(BaseEngine):
    """One role's DeepSpeed engine (actor, reference or critic) behind verl's engine API."""

    value_head = False

    def __init__(self, model_config: Any, engine_config: Any, optimizer_config: Any = None,
                 checkpoint_config: Any = None) -> None:
        super().__init__()
        use_cpu_platform_if_cpu()  # verl's helpers ask the platform for the device (see .platform)
        self.model_config = model_config
        self.engine_config = engine_config
        self.optimizer_config = optimizer_config
        self.checkpoint_config = checkpoint_config
        if not isinstance(engine_config, DeepSpeedEngineConfig):
            # verl picks the engine by the role's strategy alone: a role whose yaml is another engine's
            # (the seed's actor=ds_actor leaves the ref on model_engine's dp_ref, strategy copied from the
            # actor) lands here with that engine's section; say which group to select instead.
            raise ValueError(f"the DeepSpeed engine got {type(engine_config).__name__}, not the deepspeed section: select "
                             "the role's deepspeed yaml (model_engine=deepspeed, or ref@actor_rollout_ref.ref=deepspeed_ref "
                             "beside actor@actor_rollout_ref.actor=ds_actor)")
        self.ds = engine_config.repro_deepspeed()
        self.sp = int(engine_config.ulysses_sequence_parallel_size)
        self.forward_only = bool(engine_config.forward_only) or optimizer_config is None
        self.offload = engine_config.offload_plan(self.ds)
        self.role: RoleEngine | None = None
        self.mode: str | None = None
        self.updates = 0
        """Actor updates so far (outermost train contexts; saved in checkpoints): REPRO_FAULT_RANK's count."""
        self._train_depth = 0
        self._dp_group: Any = None
        self.varlen = False
        """Packed rows attend through repro's varlen path (:func:`repro.workers.varlen.engage`): no mask is read."""

    # ---- building ----------------------------------------------------------------------------
    def initialize(self) -> None:
        init_distributed()  # reuses verl's process group; DeepSpeed's comm joins it
        world = dist.get_world_size()
        dp = data_parallel_size(world, self.sp, "deepspeed.ulysses_sequence_parallel_size")
        torch.manual_seed(self.engine_config.seed)  # weights new to the checkpoint (critic head) alike on all ranks
        use_lora = not self.value_head and not self.forward_only and self.model_config.lora_rank > 0
        model_cfg = repro_model(self.model_config, lora=use_lora, kernels=self.engine_config)
        module = load_hf_model(model_cfg, torch_dtype(self.ds), value_head=self.value_head)
        mpu = ulysses.enable(module, self.sp, "critic" if self.value_head else "actor") if self.sp > 1 else None
        # as repro's workers: the actor's and reference's packed rows through FlashAttention (the critic's through
        # transformers' block-causal mask, as repro's critic)
        self.varlen = varlen.engage(module, model_cfg.flash_attention, torch_dtype(self.ds), packed_rows=bool(
            self.engine_config.use_remove_padding) and self.sp == 1 and not self.value_head)
        if use_lora:
            module = lora.wrap(module, model_cfg)
        optim, clip = repro_optim(self.optimizer_config) if not self.forward_only else (None, 0.0)
        # Nominal sizes only: the engine marks every accumulation boundary itself and scales no loss by GAS.
        plan = RoleBatchPlan(world=world, dp=dp, sp=self.sp, samples_per_step=dp, mini_batch_samples=dp,
                             per_rank_mini=1, micro=1, gas=1, train_batch_size=dp, num_mini_batches=1,
                             dynamic=False, max_token_len=None)
        self.role = RoleEngine(module, self.ds, plan, optim=optim, grad_clip=clip, mpu=mpu, caller_steps_lr=True)
        layer_compile.from_config(self.role.module, model_cfg.compile_layers, self.ds.zero_stage,
                                  model_cfg.compile_scope)
        if self.sp > 1:
            sp_rank = dist.get_rank() % self.sp
            for r in range(self.sp):  # every rank creates every group, in the same order
                group = dist.new_group(list(range(r, world, self.sp)))
                if r == sp_rank:
                    self._dp_group = group
        if dist.get_rank() == 0:
            print(self.setup_line(), flush=True)

    def setup_line(self) -> str:
        """What the built engine reports (``RoleEngine.report``) in the words of repro's own banner: verl
        prints the config it composed, never what an engine did with it (a run's proof of ZeRO stage,
        offload, ZeRO-3's layout, the SP group, LoRA and the fused norms is this line, on rank 0's console)."""
        rep = self.role.report()
        kind = "critic" if self.value_head else ("reference" if self.forward_only else "actor")
        built = rep if rep["stage"] is not None else None  # a forward-only module has no DeepSpeed engine
        words = [banner.engine_words(built), banner.layout_words(dist.get_world_size() // self.sp, self.sp, built),
                 f"attention {rep['attention']}" + (f" on {rep['flash_attention']}'s kernels" if self.varlen else ""),
                 *banner.fused_norm_words(rep), *banner.zero3_words(built)]
        if rep["lora_layers"]:
            words.append("LoRA" + banner.lora_readback(rep))
        return f"repro DeepSpeed engine, {kind}: " + ", ".join(words)

    # ---- verl's getters ----------------------------------------------------------------------
    @property
    def is_param_offload_enabled(self) -> bool:
        return self.offload.param != "none"

    @property
    def is_optimizer_offload_enabled(self) -> bool:
        return not self.forward_only and self.offload.optimizer != "none"

    def is_mp_src_rank_with_outputs(self) -> bool:
        return dist.get_rank() % self.sp == 0

    def get_data_parallel_size(self) -> int:
        return dist.get_world_size() // self.sp

    def get_data_parallel_rank(self) -> int:
        return dist.get_rank() // self.sp

    def get_data_parallel_group(self) -> Any:
        return self._dp_group if self.sp > 1 else dist.group.WORLD

    def train_mode(self, **kwargs: Any) -> _ModeCtx:
        return _ModeCtx(self, "train", **kwargs)

    def eval_mode(self, **kwargs: Any) -> _ModeCtx:
        return _ModeCtx(self, "eval", **kwargs)

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True) -> None:
        """No tensor moves: repro's offload is DeepSpeed's static placement.

        With ``deepspeed.offload`` the ZeRO config keeps the optimizer states (and at ZeRO-3 with
        param offload, the parameters) on the CPU for the whole run, and DeepSpeed streams them in
        itself; there is nothing left for a phase switch to move.
        """
        super().to(device=device, model=model, optimizer=optimizer, grad=grad)
        if device not in ("cpu", "cuda") and not str(device).startswith("cuda"):
            raise ValueError(f"DeepSpeed engine .to(device={device!r}): choose one of ['cpu', 'cuda']")

    # ---- one update --------------------------------------------------------------------------
    def optimizer_zero_grad(self) -> None:
        if not self.forward_only:
            self.role.engine.zero_grad()

    def optimizer_step(self) -> float:
        """DeepSpeed's step; the global grad norm before clipping (DeepSpeed skips a non-finite one)."""
        grad_norm, _ = self.role.end_update()
        return grad_norm

    def lr_scheduler_step(self) -> float:
        if self.role.lr_scheduler is not None:
            self.role.lr_scheduler.step()
        return self.role.current_lr()

    def forward_backward_batch(self, data: TensorDict, loss_function: Callable | None,
                               forward_only: bool = False) -> Any:
        """verl's micro-batch loop on this engine. An error raised in it carries a note naming this
        rank: verl's driver shows a rank's error through Ray, which names the worker's pid only."""
        try:
            return self._forward_backward_batch(data, loss_function, forward_only)
        except Exception as err:
            if hasattr(err, "add_note"):  # Python >= 3.11; the traceback verl prints shows it
                what = "forward" if forward_only else "update"
                err.add_note(f"(raised on rank {dist.get_rank()} of {dist.get_world_size()} in the {what} of "
                             f"repro's DeepSpeed engine)")
            raise

    def _forward_backward_batch(self, data: TensorDict, loss_function: Callable | None, forward_only: bool) -> Any:
        group = self.get_data_parallel_group()
        tu.assign_non_tensor(data, sp_size=self.sp)
        keep_output = tu.get_non_tensor_data(data=data, key="return_model_output", default=False)
        # On the engine's device whatever the batch's: NCCL reduces CUDA tensors only (verl's worker
        # may hand over a batch still on the CPU; the micro-batches move below).
        dtype = torch.float64 if self.role.device.type == "cpu" else torch.float32
        tokens = data["loss_mask"].sum().to(device=self.role.device, dtype=dtype)
        dist.all_reduce(tokens, group=group)
        tu.assign_non_tensor(data, batch_num_tokens=tokens.item(), dp_size=self.get_data_parallel_size())
        micro_batches, indices = prepare_micro_batches(data=data, dp_group=group, same_micro_num_in_dp=True)
        if not forward_only:
            assert not self.forward_only, "forward_backward_batch(forward_only=False) on a forward-only engine"
            self.role.begin_update()
        outputs = []
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            if not forward_only:
                self.role.start_micro(last=last)
            with torch.no_grad() if forward_only else contextlib.nullcontext():
                loss, out = self.forward_step(micro, loss_function, forward_only)
            if not forward_only:
                self.role.backward_micro(loss, last=last)
                if not keep_output:
                    out.pop("model_output", None)
            outputs.append(out)
        return postprocess_batch_func(output_lst=outputs, indices=indices, data=data)

    def forward_step(self, micro: TensorDict, loss_function: Callable | None, forward_only: bool) -> tuple:
        micro = micro.to(self.role.device)
        model_output = self.model_output(micro)
        if loss_function is not None:
            loss, metrics = loss_function(model_output=model_output, data=micro, dp_group=self.get_data_parallel_group())
        else:
            assert forward_only, "a loss function is needed to train"
            loss, metrics = torch.tensor(1.0), {}
        return loss, {"model_output": detach_tree(model_output), "loss": loss.detach().item(), "metrics": metrics}

    def model_output(self, micro: TensorDict) -> dict[str, torch.Tensor]:
        """``log_probs`` (and ``entropy``) per token, nested like ``input_ids``."""
        entropy = bool(tu.get_non_tensor_data(data=micro, key="calculate_entropy", default=False))
        temperature = model_io.scalar_temperature(micro)
        outs = model_io.per_token(
            self.role.forward, micro, self.sp,
            lambda out, labels: model_io.token_log_probs_of(out, labels, temperature, entropy), packed_only=self.varlen)
        return {"log_probs": outs[0], **({"entropy": outs[1]} if entropy else {})}

    # ---- weights, checkpoints, adapters ------------------------------------------------------
    def get_per_tensor_param(self, **kwargs: Any) -> tuple:
        """Full weights, Hugging Face names, one tensor at a time (gathered at ZeRO-3: every rank
        must consume the generator). A LoRA actor yields its merged weights, so no peft config."""
        return checkpoint.iter_full_weights(self.role), None

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None, **kwargs: Any) -> None:
        if hdfs_path:
            raise ValueError("DeepSpeed engine save_checkpoint(hdfs_path=...) is not supported; choose hdfs_path=None")
        save_engine(self.role, local_path, global_step, self.engine_config, updates=self.updates)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = True,
                        **kwargs: Any) -> None:
        _, self.updates = load_engine(self.role, local_path, self.engine_config)

    def disable_adapter(self) -> contextlib.AbstractContextManager:
        return lora.adapters_disabled(self.role.module)


class DeepSpeedValueEngine(DeepSpeedEngine):
    """The critic: a one-label token-classification head on the policy's backbone (``load_hf_model``)."""

    value_head = True

    def model_output(self, micro: TensorDict) -> dict[str, torch.Tensor]:
        (values,) = model_io.per_token(self.role.forward, micro, self.sp, lambda out, labels: (out.logits[..., 0],))
        return {"values": values}


def register() -> None:
    """Register both engines with verl (idempotent: verl's registry refuses a second registration),
    and on a CPU run verl's CPU platform (``.platform``)."""
    use_cpu_platform_if_cpu()
    engines = EngineRegistry._engines
    for model_type, cls in (("language_model", DeepSpeedEngine), ("value_model", DeepSpeedValueEngine)):
        if "deepspeed" not in engines.get(model_type, {}):
            EngineRegistry.register(model_type=model_type, backend="deepspeed", device=DEVICES)(cls)
