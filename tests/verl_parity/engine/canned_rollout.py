"""A canned rollout, so that verl 0.9.1's own trainer runs on CPU ranks (``rollout.name=canned``).

verl's trainer generates through an inference server (vLLM, SGLang or TensorRT-LLM); none runs on a
CPU host, and .venv-verl has none. This module stands in for generation only, through the three
hooks verl 0.9.1 offers for it, and leaves everything else to verl: its ``RayPPOTrainer`` (the legacy
trainer, ``trainer.use_v1=false``: the v1 trainer needs the TransferQueue package, which .venv-verl
does not have), its worker group and engine workers driving repro's DeepSpeed engine, its weight
sync (``update_weights``: the engine's full-weight export, every tensor consumed), its checkpoints.

- ``CannedRollout`` (verl's ``BaseRollout``, registered as ``("canned", "async")``): the rollout
  object each hybrid worker builds; it takes the weights verl sends and keeps none of them.
- ``CannedReplica`` (verl's ``RolloutReplica``, registered as ``canned``): launches no server.
- ``CannedAgentLoopManager`` (``actor_rollout_ref.rollout.agent.agent_loop_manager_class``): makes
  the step's batch in the trainer's process: the prompt's tokens, then a response of 2 to
  ``response_length`` tokens drawn from a generator seeded by the prompt and the step (the same on
  every run), and a score of 0 or 1 by the sample's parity (``rollout.n=2``: each group scores 0 and
  1), so that GRPO's advantages are not all 0 and every step really moves the weights.

Every Ray process imports it, as it imports repro's plugin: ``VERL_USE_EXTERNAL_MODULES`` lists both
(``tests/verl_parity/engine/trainer_job.py``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry

NAME = "canned"


class CannedRollout(BaseRollout):
    """The hybrid worker's rollout: consumes the weights verl syncs, keeps nothing."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        self.synced_tensors = 0

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        for _name, _tensor in weights:  # every rank must drain it: ZeRO-3 gathers tensor by tensor
            self.synced_tensors += 1


class CannedReplica(RolloutReplica):
    """A replica without a server: generation happens in :class:`CannedAgentLoopManager`."""

    async def launch_servers(self) -> None:
        self._server_address = f"{NAME}-{self.replica_rank}"
        self._server_handle = None

    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None


class CannedAgentLoopManager:
    """verl's agent-loop manager interface (``create``, ``generate_sequences``), without workers."""

    def __init__(self, config: Any, llm_client: Any = None, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None) -> None:
        from verl.utils import hf_tokenizer

        self.config = config
        self.rollout = config.actor_rollout_ref.rollout
        self.prompt_length = int(config.data.max_prompt_length)
        self.response_length = int(self.rollout.response_length)
        self.tokenizer = hf_tokenizer(config.actor_rollout_ref.model.path)

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> CannedAgentLoopManager:
        return cls(*args, **kwargs)

    def _prompt_ids(self, messages: Any) -> list[int]:
        text = " ".join(str(m["content"]) for m in messages)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-self.prompt_length:]

    def _response_ids(self, prompt: list[int], step: int) -> list[int]:
        digest = hashlib.sha256(f"{step}:{prompt}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        n = int(torch.randint(2, self.response_length + 1, (1,), generator=gen))
        vocab = len(self.tokenizer)
        ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
        return ids[:-1] + [self.tokenizer.eos_token_id]

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        step = int(prompts.meta_info.get("global_steps", 0))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        p_len, r_len = self.prompt_length, self.response_length
        n = len(prompts)
        out = {"prompts": torch.full((n, p_len), pad), "responses": torch.full((n, r_len), pad),
               "attention_mask": torch.zeros(n, p_len + r_len, dtype=torch.long),
               "response_mask": torch.zeros(n, r_len, dtype=torch.long)}
        rm_scores = torch.zeros(n, r_len, dtype=torch.float32)
        # The rows of one prompt are its n samples (verl repeats them interleaved): vary each by its index.
        for i, messages in enumerate(prompts.non_tensor_batch["raw_prompt"]):
            prompt = self._prompt_ids(messages)
            response = self._response_ids(prompt + [i], step)
            out["prompts"][i, p_len - len(prompt):] = torch.tensor(prompt)
            out["attention_mask"][i, p_len - len(prompt):p_len + len(response)] = 1
            out["responses"][i, :len(response)] = torch.tensor(response)
            out["response_mask"][i, :len(response)] = 1
            rm_scores[i, len(response) - 1] = float(i % 2)  # each prompt's two samples score 0 and 1
        out["input_ids"] = torch.cat([out["prompts"], out["responses"]], dim=1)
        out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        out["rm_scores"] = rm_scores
        timing = {"agent_loop/generate_sequences/mean": 0.0}
        no_images = np.empty(n, dtype=object)
        no_images[:] = [{} for _ in range(n)]  # the trainer reads each sample's (empty) multi-modal inputs
        non_tensors = {"__num_turns__": np.full(n, 2, dtype=np.int32), "multi_modal_inputs": no_images}
        return DataProto.from_dict(tensors=out, non_tensors=non_tensors,
                                   meta_info={"timing": timing, "reward_extra_keys": []})


def register() -> None:
    rollout_base._ROLLOUT_REGISTRY[(NAME, "async")] = f"{__name__}.CannedRollout"
    RolloutReplicaRegistry.register(NAME, lambda: CannedReplica)


register()
