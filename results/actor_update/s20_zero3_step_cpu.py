"""Issue 35, session 20: where ZeRO-3's optimizer step spends its host time, on CPU gloo ranks (no GPU needed).

Two ranks train a Qwen3-shaped model with the 0.6B shape's parameter structure (28 layers: 310 parameters) but a
hidden size of 64, so that the arithmetic is small and DeepSpeed's per-parameter Python shows; DeepSpeed's
``engine.step()`` runs under cProfile on rank 0 for 5 steps after 3 warm-up steps. It prints the step's mean time,
the top functions by cumulative time, and a hash of the trained weights (the same with and without the coalesced gather
of :mod:`repro.workers.zero3_persist_gather`). ``--stage 3`` keeps every parameter whole on each rank (persistence
1e7 and torch's linear, as the GPU case ``zero3_persist_1e7``; plain DeepSpeed, so without repro's leaf modules),
``--stock`` leaves DeepSpeed's per-parameter gather after the step:

    python results/actor_update/s20_zero3_step_cpu.py --stage 3 --stock
    python results/actor_update/s20_zero3_step_cpu.py --stage 3
    python results/actor_update/s20_zero3_step_cpu.py --stage 3 --phase forward_backward --top 40
    python results/actor_update/s20_zero3_step_cpu.py --stage 3 --phase forward_backward --unhook   # session 21
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import tempfile
import time

import torch
import torch.distributed as dist


def run(rank: int, world: int, args: argparse.Namespace, store: str) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)
    import deepspeed

    from repro.data.tiny_model import PolicyShape, build_model, tiny_config
    from repro.workers.zero3_persist_gather import coalesce
    from repro.workers.zero3_persist_hooks import unhook

    cfg = tiny_config(vocab_size=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=64, num_hidden_layers=28, intermediate_size=128))
    model = build_model(cfg, seed=0).to(torch.bfloat16)
    zero = {"stage": args.stage, "overlap_comm": args.stage == 3, "reduce_bucket_size": int(5e8)}
    if args.stage == 3:
        # As the GPU case zero3_persist_1e7: every weight whole, torch's linear (not DeepSpeed's autograd function).
        zero.update(stage3_param_persistence_threshold=int(1e7), memory_efficient_linear=False)
    conf = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
            "zero_optimization": zero, "gradient_clipping": 1.0, "steps_per_print": 10**9,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "torch_adam": True}}}
    engine, *_ = deepspeed.initialize(model=model, config=conf, model_parameters=model.parameters(),
                                      dist_init_required=False)
    if args.stage == 3 and not args.stock:
        coalesce(engine.optimizer)
    if args.stage == 3 and args.unhook:
        unhook(engine)
    ids = torch.randint(3, 1024, (8, 64), generator=torch.Generator().manual_seed(rank))

    def forward_backward() -> None:
        engine.backward(engine(input_ids=ids).logits.float().mean())

    for _ in range(3):
        forward_backward()
        engine.step()
    profile, spent = cProfile.Profile(), 0.0
    for _ in range(5):
        if args.phase == "forward_backward":
            t0 = time.perf_counter()
            profile.enable()
            forward_backward()
            profile.disable()
            spent += time.perf_counter() - t0
            engine.step()
            continue
        forward_backward()
        t0 = time.perf_counter()
        profile.enable()
        engine.step()
        profile.disable()
        spent += time.perf_counter() - t0
    digest = hashlib.sha256()
    for p in engine.module.parameters():
        with deepspeed.zero.GatheredParameters([p], enabled=args.stage == 3):
            digest.update(p.detach().float().numpy().tobytes())
    if rank == 0:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(args.top)
        print(f"stage {args.stage}{' stock' if args.stock else ''}{' unhooked' if args.unhook else ''}: {args.phase} {spent / 5 * 1e3:.1f} ms under cProfile, "
              f"{sum(1 for _ in model.parameters())} parameters, weights sha256 {digest.hexdigest()[:16]}")
        print("\n".join(line[:180] for line in text.getvalue().splitlines()[:args.top + 10]))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, choices=(2, 3), default=3)
    parser.add_argument("--stock", action="store_true", help="DeepSpeed's own gather after the step")
    parser.add_argument("--unhook", action="store_true",
                        help="session 21: DeepSpeed's module hooks off the modules kept whole (repro.workers.zero3_persist_hooks)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--phase", choices=("step", "forward_backward"), default="step",
                        help="what runs under cProfile: the optimizer step, or one micro-batch's forward and backward")
    args = parser.parse_args()
    torch.multiprocessing.spawn(run, args=(2, args, os.path.join(tempfile.mkdtemp(), "store")), nprocs=2)


if __name__ == "__main__":
    main()
