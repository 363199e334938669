"""``python -m repro.bench.step_counts``'s counts on 2 gloo ranks (the tiny shape, the seed preset's actor): each pass's
collectives are the ones its ZeRO case issues, read from the tracer, and its host operators are counted by issuer."""

from __future__ import annotations

from repro.bench.host_ops import NO_FRAME, profiler_gives_python_frames
from repro.bench.shapes import make_model_dir
from repro.bench.step_counts import CASES, whole_below_embedding

# 8 prompts x n 4 = 32 samples, 16 a rank; mini-batches of 4 x 4 = 16 samples, 8 a rank: two optimizer steps an update
SMALL = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
BATCH = (16, 6, 6, 3)  # samples a rank, prompt, response, shortest response


def _counts(rank: int, world: int, model_dir: str) -> dict:
    from repro.bench.step_counts import count_passes

    persist = whole_below_embedding("tiny")
    return {case: count_passes([f"actor_rollout_ref.model.path={model_dir}", *SMALL,
                                *(o.format(persist=persist) for o in CASES[case])], "grpo_0p6b", BATCH)
            for case in ("zero2", "zero3")}


def test_each_pass_counts_the_collectives_its_zero_stage_issues_and_the_host_operators_by_issuer(pooled, tmp_path):
    model_dir = str(make_model_dir("tiny", tmp_path / "model"))
    ranks = pooled(_counts, timeout_s=180, args=(model_dir,))
    for counts in ranks:
        zero2, zero3 = counts["zero2"], counts["zero3"]
        assert zero2["report"]["stage"] == 2 and zero3["report"]["stage"] == 3
        ops = {stage: {name: set(row[name]["collectives_step4"]["by_op"]) for name in ("weight_sync", "old_log_prob",
                                                                                        "update")}
               for stage, row in (("zero2", zero2), ("zero3", zero3))}
        # ZeRO-2 holds every weight: its sync reads them where they lie, its update all-reduces the gradients and
        # all-gathers the updated partitions; ZeRO-3 gathers its sharded weights and reduce-scatters the gradients.
        assert ops["zero2"]["weight_sync"] == set()
        assert {"all_reduce", "all_gather_into_tensor"} <= ops["zero2"]["update"] and \
            "reduce_scatter_tensor" not in ops["zero2"]["update"]
        assert "all_gather_into_tensor" in ops["zero3"]["weight_sync"]
        assert "reduce_scatter_tensor" in ops["zero3"]["update"]
        # Two optimizer steps an update: each step's collectives twice, the same in steps 3 and 4.
        for row in (zero2, zero3):
            assert row["update"]["collectives_step3"]["by_op"] == row["update"]["collectives_step4"]["by_op"]
        grad_norms = [s for s in zero2["update"]["collectives_step4"]["sites"] if "get_grad_norm" in s]
        assert len(grad_norms) == 1 and zero2["update"]["collectives_step4"]["sites"][grad_norms[0]] == 2
        # ZeRO-2's sync is torch's alone (views of whole weights), ZeRO-3's gathers through DeepSpeed; both updates go
        # through DeepSpeed, ZeRO-3's per-parameter partitioning more. DeepSpeed's Python calls (cProfile) show it on
        # any torch; the operators' issuers only where torch's profiler records Python frames: the GPU machine's torch
        # 2.11 records none, and there every operator is NO_FRAME's or the autograd engine's (this assertion failed
        # there with KeyError 'deepspeed', results/cpu_suite_elsewhere/README.md, session 34).
        assert zero2["weight_sync"]["deepspeed_calls"] == 0 < zero3["weight_sync"]["deepspeed_calls"]
        assert zero3["update"]["deepspeed_calls"] > zero2["update"]["deepspeed_calls"] > 0
        assert zero2["weight_sync"]["host_ops"] > 0 and zero3["weight_sync"]["host_ops"] > 0
        if profiler_gives_python_frames():
            assert "deepspeed" not in zero2["weight_sync"]["host_ops_by"]
            assert zero3["weight_sync"]["host_ops_by"]["deepspeed"] > 0
            assert zero3["update"]["host_ops_by"]["deepspeed"] > zero2["update"]["host_ops_by"]["deepspeed"] > 0
        else:
            assert all(set(row[name]["host_ops_by"]) <= {NO_FRAME, "autograd"}
                       for row in (zero2, zero3) for name in ("weight_sync", "old_log_prob", "update"))
