"""A rank's failure as one line: Ray's task and actor errors reduced to rank, host, method and message."""

from __future__ import annotations

import ray.exceptions as rex

from repro.cluster.errors import to_worker_error


def _task_error(cause: BaseException) -> rex.RayTaskError:
    return rex.RayTaskError("update_actor", "\x1b[36mray::_RankHost.call()\x1b[39m\n  File x\nValueError: boom", cause,
                            pid=11, ip="10.0.0.2")


def test_a_failed_rank_is_one_line_with_the_original_type_and_message_and_keeps_the_traceback():
    err = to_worker_error(_task_error(ValueError("boom\nsecond line")), 1, "10.0.0.2", "update_actor")
    assert str(err) == "rank 1 on host 10.0.0.2 failed in update_actor: ValueError: boom"
    assert not err.died and "File x" in err.details and "\x1b" not in err.details
    assert str(err.with_log("/run/train.log")).endswith("ValueError: boom (full log: /run/train.log)")


def test_a_dead_rank_is_named_with_rays_exit_type_and_detail_only():
    died = rex.ActorDiedError.__new__(rex.ActorDiedError)
    died.error_msg = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker "
                      "exit detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common "
                      "causes include: (1) the process was killed by the OOM killer")
    err = to_worker_error(died, 0, "10.0.0.3", "generate")
    assert err.died and str(err) == ("rank 0 on host 10.0.0.3 died in generate: the rank's process ended "
                                     "(SYSTEM_ERROR: Worker unexpectedly exits with a connection error code 2.)")
    wrapped = to_worker_error(_task_error(died), 0, "10.0.0.3", "generate")
    assert wrapped.died and str(wrapped) == str(err)


def test_out_of_gpu_memory_names_the_keys_that_bound_the_call_it_happened_in():
    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name, as the remote traceback gives it
        pass

    oom = OutOfMemoryError("CUDA out of memory. Tried to allocate 2.32 GiB. GPU 0 has a total capacity of 79.19 GiB")
    err = to_worker_error(_task_error(oom), 1, "10.0.0.2", "update_actor")
    assert str(err).startswith("rank 1 on host 10.0.0.2 failed in update_actor: OutOfMemoryError: CUDA out of memory.")
    assert str(err).endswith("-> out of GPU memory in update_actor: lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu "
                             "(with use_dynamic_bsz=True) or ppo_micro_batch_size_per_gpu, actor_rollout_ref.model."
                             "enable_gradient_checkpointing=True, or actor_rollout_ref.actor.deepspeed.offload=cpu")
    assert "\n" not in str(err)
    gen = to_worker_error(_task_error(oom), 0, "h", "generate")
    assert "lower actor_rollout_ref.rollout.gpu_memory_utilization" in str(gen)


def test_a_vllm_engine_that_cannot_fit_says_which_share_to_raise():
    err = to_worker_error(_task_error(ValueError(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.")),
        0, "h", "create")
    assert str(err).endswith("-> vLLM's engine did not fit: raise actor_rollout_ref.rollout.gpu_memory_utilization or "
                             "lower actor_rollout_ref.rollout.max_model_len")


def test_an_error_of_no_known_cause_gets_no_advice():
    assert "->" not in str(to_worker_error(_task_error(ValueError("boom")), 1, "h", "update_actor"))
