"""The numbers of docs/scaling.md: a GRPO run of Qwen3 0.6B / 8B / 32B at 8, 64 and 512 GPUs.

``python scripts/scaling_estimates.py`` prints the tables. Sources, in order of trust:

- parameter counts: the Qwen3 models built from their published ``config.json`` shapes with
  ``transformers`` on the meta device (nothing downloaded, nothing allocated);
- batch split: repro's own ``repro.batching.plan.plan_batch`` (what a run would do, or refuse);
- ZeRO model-state memory per GPU: DeepSpeed's own estimators
  (``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``);
- checkpoint bytes, collective bytes and driver traffic: arithmetic written out below, from
  the dtypes repro uses (bf16 weights, fp32 Adam states, int64 token tensors).
"""

from __future__ import annotations

import torch
import transformers
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from repro.batching.plan import BatchParams, plan_batch

# Shapes from Qwen/Qwen3-{0.6B,8B,32B}/config.json.
QWEN3 = {
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
    "32B": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False),
}
SCALES = {8: (1, 8), 64: (8, 8), 512: (64, 8)}  # GPUs: (nnodes, n_gpus_per_node)
# The recipe: verl's GSM8K GRPO shape, one batch for every scale (it splits evenly on 512 ranks).
PROMPTS, N, MINI, MICRO, EPOCHS, PROMPT_LEN, RESPONSE_LEN = 1024, 8, 256, 4, 1, 512, 1024
# Assumed bandwidths (stated in the doc): shared filesystem per node and in aggregate.
NODE_WRITE_GBS, FS_AGGREGATE_GBS = 2.0, 20.0
GB = 1e9


def params(name: str) -> tuple[int, int]:
    """(total, largest single parameter) of the model built on the meta device."""
    cfg = transformers.Qwen3Config(**QWEN3[name])
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(cfg)
    unique = {id(p): p.numel() for p in model.parameters()}  # tied embeddings count once
    return sum(unique.values()), max(unique.values())


def batch_table() -> list[str]:
    rows = ["| GPUs | nodes x GPUs | samples/step | per node | per rank | mini-batches | per-rank mini | micro | GAS | DS train_batch_size |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for gpus, (nnodes, per_node) in SCALES.items():
        p = plan_batch(BatchParams(n_gpus_per_node=per_node, nnodes=nnodes, sp=1, rollout_n=N,
                                   train_batch_size=PROMPTS, ppo_mini_batch_size=MINI,
                                   ppo_micro_batch_size_per_gpu=MICRO))
        rows.append(f"| {gpus} | {nnodes} x {per_node} | {p.samples_per_step} | {p.samples_per_step // nnodes} | "
                    f"{p.samples_per_step // p.dp} | {p.num_mini_batches} | {p.per_rank_mini} | {p.micro} | {p.gas} | "
                    f"{p.train_batch_size} |")
    return rows


def memory_table(sizes: dict[str, tuple[int, int]]) -> list[str]:
    rows = ["| model | GPUs | ZeRO-2 GPU | ZeRO-2 + optimizer offload GPU / CPU per node | ZeRO-3 GPU | "
            "ZeRO-3 + param+optimizer offload GPU / CPU per node |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (total, largest) in sizes.items():
        for gpus, (nnodes, per_node) in SCALES.items():
            kw = dict(num_gpus_per_node=per_node, num_nodes=nnodes)
            _, z2 = estimate_zero2_model_states_mem_needs(total, cpu_offload=False, **kw)
            z2o_cpu, z2o = estimate_zero2_model_states_mem_needs(total, cpu_offload=True, **kw)
            _, z3, _ = estimate_zero3_model_states_mem_needs(total, largest, cpu_offload=False, **kw)
            z3o_cpu, z3o, _ = estimate_zero3_model_states_mem_needs(total, largest, cpu_offload=True,
                                                                 cpu_offload_params=True, **kw)
            rows.append(f"| {name} | {gpus} | {z2 / GB:.2f} GB | {z2o / GB:.2f} / {z2o_cpu / GB:.1f} GB | "
                        f"{z3 / GB:.2f} GB | {z3o / GB:.2f} / {z3o_cpu / GB:.1f} GB |")
    return rows


def checkpoint_table(sizes: dict[str, tuple[int, int]]) -> list[str]:
    """bf16 module (2 B/param) + fp32 master, Adam m and v (12 B/param), actor only (GRPO)."""
    rows = ["| model | GPUs | checkpoint total | optimizer shard per rank | write time (max of node and FS limits) |",
            "| --- | --- | --- | --- | --- |"]
    for name, (total, _) in sizes.items():
        for gpus, (_nnodes, per_node) in SCALES.items():
            whole, shard = 14 * total, 12 * total / gpus
            # Rank 0 also writes the whole bf16 module (below ZeRO-3): its node writes the most.
            busiest_node = 2 * total + shard * per_node
            seconds = max(busiest_node / (NODE_WRITE_GBS * GB), whole / (FS_AGGREGATE_GBS * GB))
            rows.append(f"| {name} | {gpus} | {whole / GB:.1f} GB | {shard / GB:.3f} GB | {seconds:.1f} s |")
    return rows


def collective_table(sizes: dict[str, tuple[int, int]]) -> list[str]:
    """Bytes each rank sends per RL step in ring collectives (all-gather / reduce-scatter: (n-1)/n x size)."""
    rows = ["| model | GPUs | ZeRO-1 | ZeRO-2 | ZeRO-3 | per-step calls (Z1 / Z2 / Z3) |", "| --- | --- | --- | --- | --- | --- |"]
    for name, (total, _) in sizes.items():
        for gpus, (nnodes, per_node) in SCALES.items():
            p = plan_batch(BatchParams(n_gpus_per_node=per_node, nnodes=nnodes, sp=1, rollout_n=N,
                                       train_batch_size=PROMPTS, ppo_mini_batch_size=MINI,
                                       ppo_micro_batch_size_per_gpu=MICRO))
            ring = (gpus - 1) / gpus
            bf16 = 2 * total * ring
            opt_steps = EPOCHS * p.num_mini_batches
            micros = opt_steps * p.gas
            # Forward-only micro-batches of the old-log-prob pass (log_prob_micro_batch_size_per_gpu = MICRO).
            fwd = -(-(p.samples_per_step // p.dp) // MICRO)
            z1 = opt_steps * 2 * bf16                   # reduce-scatter grads + all-gather params per optimizer step
            z2 = micros * bf16 + opt_steps * bf16       # reduce-scatter every micro-batch, all-gather per step
            z3 = bf16 + fwd * bf16 + micros * 3 * bf16  # weight sync + log-prob forwards + (fwd AG, bwd AG, RS)
            rows.append(f"| {name} | {gpus} | {z1 / GB:.1f} GB | {z2 / GB:.1f} GB | {z3 / GB:.1f} GB | "
                        f"{2 * opt_steps} / {micros + opt_steps} / {1 + fwd + 3 * micros} (x buckets / layers) |")
    return rows


def driver_table() -> list[str]:
    """What crosses the driver per GRPO step (no critic, no KL): int64 token tensors and fp32 per-token values."""
    s, length, r = PROMPTS * N, PROMPT_LEN + RESPONSE_LEN, RESPONSE_LEN
    tokens = 8 * s * (3 * length + 2 * r)  # input_ids, attention_mask, position_ids [S,L]; responses, mask [S,R]
    per_token = 4 * s * r
    moves = {
        "generate: batch back to the driver": tokens,
        "old log-prob: batch out, log-probs + entropy back": tokens + 2 * per_token,
        "update actor: batch + old log-probs + advantages out": tokens + 2 * per_token,
    }
    rows = ["| transfer | bytes |", "| --- | --- |"]
    rows += [f"| {k} | {v / GB:.2f} GB |" for k, v in moves.items()]
    rows.append(f"| total per step (any GPU count) | {sum(moves.values()) / GB:.2f} GB |")
    return rows


def main() -> None:
    sizes = {name: params(name) for name in QWEN3}
    print("## parameters (meta-device build)\n")
    for name, (total, largest) in sizes.items():
        print(f"- Qwen3-{name}: {total:,} parameters; largest single tensor {largest:,}")
    for title, rows in (("batch split (repro.batching.plan.plan_batch)", batch_table()),
                        ("ZeRO model states per GPU (DeepSpeed estimators)", memory_table(sizes)),
                        ("checkpoint per save", checkpoint_table(sizes)),
                        ("collective bytes sent per rank per RL step", collective_table(sizes)),
                        ("driver tensor traffic per step", driver_table())):
        print(f"\n## {title}\n")
        print("\n".join(rows))


if __name__ == "__main__":
    main()
