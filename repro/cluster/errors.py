"""Errors of the ranks, as the user should see them: which rank, on which host, saying what.

``ray.get`` on a failed rank call raises a ``RayTaskError`` whose text is two nested tracebacks
and whose rank is nowhere; a rank that died (killed, out of memory, segfault) gives an
``ActorDiedError`` naming an actor id. :func:`gather` waits for the calls of all ranks in the
order they finish and turns the first failure into a :class:`WorkerError`: one line (rank, host,
method, the original exception type and message, or "died") with the full remote traceback kept
in ``.details`` for the run's log.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


class WorkerError(RuntimeError):
    """A rank failed or died; ``str()`` is one line, ``details`` the remote traceback."""

    def __init__(self, rank: int, host: str, method: str, summary: str, details: str, died: bool) -> None:
        self.rank, self.host, self.method, self.died = rank, host, method, died
        self.details = re.sub(r"\x1b\[[0-9;]*m", "", details)  # Ray colours the remote traceback's header
        self.summary = summary
        super().__init__(f"rank {rank} on host {host} {'died' if died else 'failed'} in {method}: {summary}")

    def with_log(self, path: object) -> WorkerError:
        """The same error, its line ending with where the full traceback is."""
        return WorkerError(self.rank, self.host, self.method, f"{self.summary} (full log: {path})", self.details,
                           self.died)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


# What to change when a rank runs out of GPU memory, by the call it ran out in (at the seed's scale the
# first thing a user meets): the keys that bound that call's memory.
_OOM_KEYS = {
    "create": "actor_rollout_ref.rollout.gpu_memory_utilization (vLLM's share) or actor_rollout_ref.actor.deepspeed.offload=cpu",
    "generate": "actor_rollout_ref.rollout.gpu_memory_utilization, max_num_seqs or data.max_response_length",
    "compute_log_prob": "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu (with log_prob_use_dynamic_bsz=True) "
                        "or log_prob_micro_batch_size_per_gpu",
    "update_actor": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu (with use_dynamic_bsz=True) or "
                    "ppo_micro_batch_size_per_gpu, actor_rollout_ref.model.enable_gradient_checkpointing=True, or "
                    "actor_rollout_ref.actor.deepspeed.offload=cpu",
    "update_critic": "critic.ppo_max_token_len_per_gpu (with use_dynamic_bsz=True) or critic.ppo_micro_batch_size_per_gpu, "
                     "or critic.deepspeed_config.offload=cpu",
}
# vLLM's own words when its engine cannot fit its KV cache in the share it was given.
_VLLM_NO_ROOM = re.compile(r"No available memory for the cache blocks|KV cache is needed|larger than the available KV cache",
                           re.IGNORECASE)


def advice(method: str, summary: str) -> str | None:
    """The key to change for a failure whose cause is known (out of GPU memory, vLLM's engine not fitting)."""
    if _VLLM_NO_ROOM.search(summary):
        return ("vLLM's engine did not fit: raise actor_rollout_ref.rollout.gpu_memory_utilization or lower "
                "actor_rollout_ref.rollout.max_model_len")
    if "OutOfMemoryError" in summary or "CUDA out of memory" in summary:
        keys = _OOM_KEYS.get(method, "the batch's token budgets or micro-batch sizes, or CPU offload")
        return f"out of GPU memory in {method}: lower {keys}"
    return None


def to_worker_error(err: Exception, rank: int, host: str, method: str) -> WorkerError:
    """The :class:`WorkerError` for ``err`` raised by rank ``rank``'s call of ``method``; a known cause's
    advice (:func:`advice`) ends its line."""
    error = _to_worker_error(err, rank, host, method)
    hint = None if error.died else advice(method, error.summary)
    if hint:
        return WorkerError(rank, host, method, f"{error.summary} -> {hint}", error.details, error.died)
    return error


def _to_worker_error(err: Exception, rank: int, host: str, method: str) -> WorkerError:
    import ray  # here, not at the top: the driver names WorkerError before it imports Ray

    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause
        if isinstance(cause, ray.exceptions.RayActorError):
            return _to_worker_error(cause, rank, host, method)
        summary = f"{type(cause).__name__}: {_first_line(cause)}" if cause is not None else _first_line(err)
        return WorkerError(rank, host, method, summary, str(err), died=False)
    if isinstance(err, ray.exceptions.RayActorError):
        text = str(getattr(err, "error_msg", None) or err)
        # Ray's message for a dead actor is a paragraph of generic advice; keep its exit type and detail.
        kind = re.search(r"Worker exit type: (\w+)", text)
        detail = re.search(r"Worker exit detail: (.*?\.)(\s|$)", text)
        reason = ": ".join(m.group(1) for m in (kind, detail) if m) or _first_line(text)
        return WorkerError(rank, host, method, f"the rank's process ended ({reason})", text, died=True)
    return WorkerError(rank, host, method, f"{type(err).__name__}: {_first_line(err)}", repr(err), died=False)


# After a first failure, how long the other ranks get to report theirs: a dead rank's peers often
# fail first (a closed gloo connection), and the dead rank is the one to name.
_GRACE_S = 3.0


def gather(refs: Sequence[Any], method: str, hosts: Sequence[str]) -> list[Any]:
    """``ray.get(refs)`` (one ref per rank, in rank order), raising :class:`WorkerError` for a failed
    rank (a dead one first); peers blocked on it are waited for only ``_GRACE_S``."""
    import ray

    index = {ref: rank for rank, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    errors: list[WorkerError] = []
    pending = list(refs)
    while pending and not errors:
        ready, pending = ray.wait(pending, num_returns=1)
        errors += _collect(ready, index, results, method, hosts)
    if errors:
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=_GRACE_S) if pending else ([], [])
        errors += _collect(ready, index, results, method, hosts)
        raise next((e for e in errors if e.died), errors[0])
    return [results[r] for r in range(len(refs))]


def _collect(ready: list[Any], index: dict[Any, int], results: dict[int, Any], method: str,
             hosts: Sequence[str]) -> list[WorkerError]:
    import ray

    errors = []
    for ref in ready:
        rank = index[ref]
        try:
            results[rank] = ray.get(ref)
        except Exception as e:  # noqa: BLE001 - every rank failure is reported
            errors.append(to_worker_error(e, rank, hosts[rank] if rank < len(hosts) else "?", method))
    return errors
