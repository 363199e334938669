"""The worker tests on 2 GPUs: NCCL, bf16 parameters, ZeRO-1/2/3 (the GPU half of issue 4).

- Updates: actor ``update_policy`` and critic ``update_critic`` (bf16, with and without fp32
  gradient accumulation) against the single-process fp32 PyTorch reference of
  ``tests/distributed/workers/helpers.py`` started from the same bf16-rounded weights; the
  actor's ``compute_log_prob`` against an fp32 forward.
- Weight export: ``iter_full_weights`` equals DeepSpeed's gathered fp32 master weights rounded to
  bf16, on both ranks, at every stage.
- Checkpoints: save at step ``SAVE_AT``, load in fresh ranks, continue to ``TOTAL``; equals the
  uninterrupted run; the exported Hugging Face folder holds the gathered weights.

Why the update tolerance is ``REL_TOL`` and Adam's ``eps`` is ``ADAM_EPS``: DeepSpeed keeps
fp32 master weights and fp32 Adam states, so the only difference from the reference is the bf16
forward/backward: every matmul input is rounded to 8 significant bits (2**-9 = 2e-3 relative per
rounding), which leaves the gradients a ~1e-2 relative error. With the default ``eps=1e-8``
Adam's first updates are ``lr * sign(g)``, so every element whose true gradient is near zero can
move the wrong way by ``2 * lr``: a single-process emulation (bf16 model, fp32 master, torch
AdamW) measured a 0.13-0.15 relative error of the weight delta that way, as large as real bugs.
``eps=1e-2`` (of the order of the per-element gradients) makes the update Lipschitz in the
gradient while it stays Adam-shaped (the largest change is 0.03 for lr 1e-2). The emulation then
measured 0.9-1.0e-2 (actor, critic), and the bugs this test exists for measured far above
5e-2: half of a mini-batch dropped 0.41-0.74, the actor loss scaled by 1/2 (a dp or GAS factor
twice) 0.24. (The critic's gradient is clipped, so a scale error shows only in its grad norm,
which is checked against the reference's with ``NORM_REL_TOL``.) The update is asserted
non-trivial: the reference moves some weight by more than ``MIN_DELTA``.

Resume: the ranks run with ``torch.use_deterministic_algorithms(True, warn_only=True)`` and
``CUBLAS_WORKSPACE_CONFIG=:4096:8``; NCCL's ring reductions on fixed sizes and topology are
run-to-run deterministic, so the resumed run is expected to equal the uninterrupted one
bitwise. Kernels without a deterministic variant only warn, so the assertion allows
``RESUME_REL_TOL`` of the post-save weight movement (a lost optimizer state or a wrong
weight is off by O(1)); the test prints whether the match was bitwise.

``REPRO_GPU_WORKERS_ON_GLOO=1`` runs the same rank functions on 2 gloo CPU ranks (still in
bf16) without the GPU gate: a check of the test logic on a machine without GPUs (about 2
minutes on 2 cores). It proves nothing about NCCL or CUDA.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch

from conftest import require_cuda_gpus
from tests.distributed.workers.helpers import (
    ZERO3_PARTITION_ALL,
    Reference,
    global_mini_batches,
    make_cfg,
    make_model_dir,
    make_step_batch,
    params_of,
    shard,
    train_steps,
)
from tests.multirank import run_ranks

pytestmark = pytest.mark.gpu

WORLD = 2
ON_GLOO = os.environ.get("REPRO_GPU_WORKERS_ON_GLOO") == "1"
BACKEND = "gloo" if ON_GLOO else "nccl"
# cuBLAS needs a fixed workspace to be deterministic (else deterministic mode raises on matmul).
RANK_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "PYTHONUNBUFFERED": "1"}
TIMEOUT_S = 300

SAMPLES = 8          # train_batch_size 4 x n 2; 4 per rank: 2 mini-batches of 2 micro-batches
PER_RANK_MINI = 2
STEPS = 2
ADAM_EPS = 1e-2      # see the module docstring
REL_TOL = 5e-2       # relative L2 error of the weight delta (see the module docstring)
NORM_REL_TOL = 5e-2  # grad norm and value loss, same reasoning
MIN_DELTA = 1e-3     # the reference's largest weight change must exceed this
# log-probs: bf16 logits of magnitude ~1 carry up to 2**-9 = 2e-3 rounding each, plus the
# forward's accumulated error; the gloo dry run (CPU bf16 kernels) measured 1.3e-3.
LOGPROB_ATOL = 1e-2
SAVE_AT, TOTAL = 2, 4
RESUME_REL_TOL = 1e-2
RESUME_CASES = [("actor", 1), ("actor", 2), ("critic", 2), ("actor", 3), ("critic", 3)]


def _require_gpus() -> None:
    if not ON_GLOO:
        require_cuda_gpus(WORLD)


def _cfg(model_dir: str, stage: int, fp32_accum: bool):
    cfg = make_cfg(model_dir, world=WORLD, stage=stage, micro=1, model_dtype="bfloat16",
                   fp32_grad_accum=fp32_accum, use_kl_loss=True, entropy_coeff=0.01)
    for section in (cfg.actor_rollout_ref.actor, cfg.critic):
        section.optim.eps = ADAM_EPS
    return cfg


def _worker(cfg, role: str, stage: int):
    from repro.workers.actor import ActorWorker
    from repro.workers.critic import CriticWorker

    overrides = ZERO3_PARTITION_ALL if stage == 3 else None
    cls = ActorWorker if role == "actor" else CriticWorker
    return cls(cfg, ds_overrides=overrides)


def _free_memory() -> None:
    """Free the last case's engine (the caller dropped it) before the next one is built."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _fp32_master(worker) -> dict[str, torch.Tensor]:
    """DeepSpeed's full fp32 master weights (a collective at every stage: all ranks call it)."""
    from deepspeed.utils import safe_get_full_fp32_param

    out = {}
    for name, p in worker.engine.module.named_parameters():
        full = safe_get_full_fp32_param(p)
        assert full is not None, f"{name} has no fp32 master copy"
        out[name] = full.detach().float().cpu().clone()
    return out


def _weights_training_dtype(worker) -> dict[str, torch.Tensor]:
    """``iter_full_weights`` as yielded (bf16), on CPU."""
    return {name: t.detach().cpu().clone() for name, t in worker.iter_full_weights()}


def _check_rank_setup(worker, stage: int) -> dict:
    """What the rank really runs on: device, backend, dtype, ZeRO stage, partitioning."""
    import torch.distributed as dist

    from repro.devices import on_cpu

    module = worker.engine.module
    params = list(module.parameters())
    partitioned = sum(1 for p in params if getattr(p, "ds_tensor", None) is not None
                      and p.ds_tensor.numel() < p.ds_numel)
    return {
        "backend": dist.get_backend(),
        "on_cpu": on_cpu(),
        "device": str(worker.engine.device),
        "cuda_device": torch.cuda.current_device() if not on_cpu() else None,
        "dtype": str(params[0].dtype),
        "zero_stage": worker.engine.engine.zero_optimization_stage(),
        "partitioned": partitioned,
        "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                               "NVSHMEM_DISABLE_NVLS", "DS_ACCELERATOR")},
    }


def _train_cases(rank: int, world: int, model_dir: str, stage: int) -> list[dict]:
    out = []
    for role in ("actor", "critic"):
        for fp32_accum in (False, True):
            cfg = _cfg(model_dir, stage, fp32_accum)
            worker = _worker(cfg, role, stage)
            res: dict = {"role": role, "fp32_accum": fp32_accum, "setup": _check_rank_setup(worker, stage),
                         "init": params_of(worker)}
            if role == "actor":
                lp = worker.compute_log_prob(shard(make_step_batch(100, SAMPLES), rank, world))
                res["log_probs"] = lp["log_probs"].float().cpu()
            update = worker.update_policy if role == "actor" else worker.update_critic
            res["metrics"] = [update(shard(make_step_batch(100 + s, SAMPLES), rank, world)) for s in range(STEPS)]
            res["weights"] = _weights_training_dtype(worker)
            res["master"] = _fp32_master(worker)
            out.append(res)
            del worker
            _free_memory()
    return out


def _rel_l2(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all tensors together."""
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    num = sum(float(((a[k] - b[k]) ** 2).sum()) for k in b)
    den = sum(float((b[k] ** 2).sum()) for k in b)
    return (num / den) ** 0.5


def _delta(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: after[k].float() - before[k].float() for k in before}


def _check_setup(setup: dict, stage: int, rank: int) -> None:
    assert setup["zero_stage"] == stage, setup
    assert setup["dtype"] == "torch.bfloat16", setup
    if stage == 3:
        assert setup["partitioned"] > 0, f"ZeRO-3 partitioned no parameter: {setup}"
    if ON_GLOO:
        return
    assert setup["backend"] == "nccl" and not setup["on_cpu"], setup
    assert setup["device"] == f"cuda:{rank}" and setup["cuda_device"] == rank, setup
    assert setup["env"]["NCCL_NVLS_ENABLE"] == "0" and setup["env"]["NVSHMEM_DISABLE_NVLS"] == "1", setup
    assert setup["env"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1", setup


def _check_log_probs(model_dir: str, init: dict[str, torch.Tensor], got: list[torch.Tensor]) -> float:
    """fp32 forward of the bf16-rounded initial weights vs the workers' bf16 log-probs."""
    from transformers import AutoModelForCausalLM

    from repro.rl.algorithms import logprobs_from_logits

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init[name])
    worst = 0.0
    for rank in range(WORLD):
        mb = shard(make_step_batch(100, SAMPLES), rank, WORLD)
        with torch.no_grad():
            logits = model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                           position_ids=mb["position_ids"]).logits[:, -mb["responses"].shape[1] - 1:-1]
        want = logprobs_from_logits(logits, mb["responses"])
        mask = mb["response_mask"].bool()
        worst = max(worst, float((got[rank][mask] - want[mask]).abs().max()))
    return worst


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_bf16_updates_on_nccl_match_fp32_reference_and_export_gathered_weights(stage, tmp_path):
    _require_gpus()
    model_dir = make_model_dir(tmp_path / "model")
    results = run_ranks(_train_cases, WORLD, tmp_path=tmp_path, timeout_s=TIMEOUT_S, args=(model_dir, stage),
                        env=RANK_ENV, backend=BACKEND)
    report = []
    for i, r0 in enumerate(results[0]):
        case = f"ZeRO-{stage} {r0['role']} fp32_accum={r0['fp32_accum']}"
        r1 = results[1][i]
        for rank, res in enumerate((r0, r1)):
            _check_setup(res["setup"], stage, rank)
        # (c) weight export: what iter_full_weights yields is DeepSpeed's fp32 master rounded to
        # the training dtype, identical on both ranks.
        for res in (r0, r1):
            assert res["weights"].keys() == res["master"].keys(), case
            for name, w in res["weights"].items():
                assert w.dtype == torch.bfloat16, (case, name, w.dtype)
                assert torch.equal(w, res["master"][name].to(torch.bfloat16)), (case, name)
        for name in r0["weights"]:
            assert torch.equal(r0["weights"][name], r1["weights"][name]), (case, name)
            assert torch.equal(r0["master"][name], r1["master"][name]), (case, name)

        # (a) the update against the fp32 reference from the same (bf16-rounded) start.
        cfg = _cfg(model_dir, stage, r0["fp32_accum"])
        torch.manual_seed(0)
        ref = Reference(cfg, r0["role"])
        ref.set_weights(r0["init"])
        prefix = r0["role"]
        for step in range(STEPS):
            minis = global_mini_batches(make_step_batch(100 + step, SAMPLES), WORLD, PER_RANK_MINI)
            outs = [ref.update(m) for m in minis]
            want_norm = sum(n for _, n in outs) / len(outs)
            got_norm = r0["metrics"][step][f"{prefix}/grad_norm"]
            assert got_norm == pytest.approx(want_norm, rel=NORM_REL_TOL), (case, step)
            assert r0["metrics"][step][f"{prefix}/skipped_steps"] == 0.0, (case, step)
            if prefix == "critic":  # the actor's loss metric leaves out its KL and entropy terms
                got_loss = sum(r[i]["metrics"][step]["critic/vf_loss"] for r in results) / WORLD
                want_loss = sum(loss for loss, _ in outs) / len(outs)
                assert got_loss == pytest.approx(want_loss, rel=NORM_REL_TOL), (case, step)
        ref_delta = _delta(ref.params(), r0["init"])
        moved = max(float(d.abs().max()) for d in ref_delta.values())
        assert moved > MIN_DELTA, f"{case}: the reference update is trivial (max |delta| {moved:.3g})"
        err = _rel_l2(_delta(r0["master"], r0["init"]), ref_delta)
        line = f"{case}: weight-delta rel L2 error {err:.3e} (reference max |delta| {moved:.3g})"
        if prefix == "actor":
            lp_err = _check_log_probs(model_dir, r0["init"], [r0["log_probs"], r1["log_probs"]])
            line += f", log-prob max abs error {lp_err:.3e}"
            assert lp_err < LOGPROB_ATOL, line
        report.append(line)
        assert err < REL_TOL, line
    print("\n".join(report))


# ---- checkpoints --------------------------------------------------------------------------

def _rng_draws() -> dict[str, torch.Tensor]:
    draws = {"cpu": torch.rand(3)}
    if torch.cuda.is_available() and BACKEND == "nccl":
        draws["cuda"] = torch.rand(3, device="cuda").cpu()
    return draws


def _ckpt_run(rank: int, world: int, model_dir: str, root: str, resume: bool) -> list[dict]:
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Deterministic mode also fills torch.empty with NaN; results never read uninitialised
    # memory, and DeepSpeed's scratch buffers should not be the thing this test probes.
    from torch.utils import deterministic

    deterministic.fill_uninitialized_memory = False
    if resume:
        torch.manual_seed(999)  # a fresh process's RNG differs; the checkpoint must restore it
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(999)
    results = []
    for role, stage in RESUME_CASES:
        worker = _worker(_cfg(model_dir, stage, False), role, stage)
        ckpt = os.path.join(root, f"{role}{stage}")
        res: dict = {}
        if resume:
            res["extra"] = worker.load_checkpoint(ckpt)
            res["metrics"] = []
        else:
            res["metrics"] = train_steps(worker, role, rank, world, range(SAVE_AT), SAMPLES)
            res["at_save"] = _fp32_master(worker)
            res["path"] = worker.save_checkpoint(ckpt, SAVE_AT, {"data_position": 17})
        res["draw"] = _rng_draws()  # the RNG streams right after the save / load
        res["metrics"] += train_steps(worker, role, rank, world, range(SAVE_AT, TOTAL), SAMPLES)
        res["master"] = _fp32_master(worker)
        res["weights"] = _weights_training_dtype(worker)
        if not resume:
            res["export"] = os.path.join(root, f"hf_{role}{stage}")
            worker.export_hf(res["export"])
        results.append(res)
        del worker
        _free_memory()
    return results


def test_bf16_resume_on_nccl_equals_uninterrupted_run_and_export_matches(tmp_path):
    _require_gpus()
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    model_dir = make_model_dir(tmp_path / "model")
    root = str(tmp_path / "ckpt")
    kw = {"tmp_path": tmp_path, "timeout_s": TIMEOUT_S, "env": RANK_ENV, "backend": BACKEND}
    full = run_ranks(_ckpt_run, WORLD, args=(model_dir, root, False), **kw)
    resumed = run_ranks(_ckpt_run, WORLD, args=(model_dir, root, True), **kw)
    report = []
    for i, (role, stage) in enumerate(RESUME_CASES):
        case = f"ZeRO-{stage} {role}"
        bitwise = True
        for rank in range(WORLD):
            a, b = full[rank][i], resumed[rank][i]
            assert b["extra"] == {"data_position": 17}, case
            assert a["draw"].keys() == b["draw"].keys(), case
            for kind in a["draw"]:
                assert torch.equal(a["draw"][kind], b["draw"][kind]), (case, kind, "RNG state not restored")
            got, want = b["metrics"], a["metrics"][SAVE_AT:]
            assert len(got) == len(want) == TOTAL - SAVE_AT, case
            for g, w in zip(got, want, strict=True):
                assert g.keys() == w.keys(), case
                for key in (f"{role}/grad_norm", "actor/pg_loss" if role == "actor" else "critic/vf_loss"):
                    assert g[key] == pytest.approx(w[key], rel=RESUME_REL_TOL, abs=1e-6), (case, key)
                bitwise &= g == w
            moved = _delta(a["master"], a["at_save"])
            err = _rel_l2(_delta(b["master"], a["at_save"]), moved)
            assert max(float(d.abs().max()) for d in moved.values()) > MIN_DELTA, (case, "no update after save")
            assert err < RESUME_REL_TOL, f"{case} rank {rank}: resumed vs uninterrupted rel error {err:.3e}"
            bitwise &= all(torch.equal(a["master"][k], b["master"][k]) for k in a["master"])
            bitwise &= all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
        assert Path(full[0][i]["path"]).name == f"{role}{stage}", case  # one checkpoint, one folder
        # The exported folder reloads with transformers and holds exactly the gathered weights.
        auto = AutoModelForCausalLM if role == "actor" else AutoModelForTokenClassification
        loaded = dict(auto.from_pretrained(full[0][i]["export"], dtype=torch.bfloat16).named_parameters())
        weights = full[0][i]["weights"]
        assert loaded.keys() == weights.keys(), case
        for name, tensor in weights.items():
            assert torch.equal(loaded[name].detach(), tensor), (case, name)
        report.append(f"{case}: resume {'bitwise equal' if bitwise else 'within tolerance, NOT bitwise'}")
    print("\n".join(report))


def _packed_forward(rank: int, world: int, model_dir: str) -> dict:
    from repro.batching.batch import HOST_COPIED, host_key, select
    from repro.workers import ulysses
    from repro.workers.actor import ActorWorker

    cfg = make_cfg(model_dir, world=world, stage=1, micro=4, mini=4, train_batch_size=4, model_dtype="bfloat16")
    cfg.actor_rollout_ref.model.use_remove_padding = True
    worker = ActorWorker(cfg)
    mb = select(ulysses.rank_batch(make_step_batch(7, 8), 1, worker.engine.device), [0, 1, 2, 3])
    without = {k: v for k, v in mb.items() if k not in {host_key(c) for c in HOST_COPIED}}  # masks from the device
    with torch.no_grad():
        worker._log_probs(mb, with_entropy=True)  # first call: the compiled log-prob chunks, lazy CUDA state
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any device wait raises, naming the call
        try:
            got, _ = worker._log_probs(mb, with_entropy=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        ref, _ = worker._log_probs(without, with_entropy=True)
    return {"varlen": worker.varlen, "equal": bool(torch.equal(got, ref))}


def test_a_packed_micro_batch_forward_waits_for_no_device_work_and_equals_the_device_masks_path(tmp_path):
    # Session 34's py-spy samples of the 0.6B update on one H100: before each micro-batch the host waited for the
    # device to drain (the mask's copy to the host), then the device idled until the host had issued the next
    # forward (results/actor_update/README.md). From the masks' host copies the packing, the response slots and the
    # varlen boundaries need no device value; the log-probs are the same bitwise (the same index math).
    require_cuda_gpus(1)
    model_dir = make_model_dir(tmp_path / "model")
    (res,) = run_ranks(_packed_forward, 1, tmp_path=tmp_path, timeout_s=TIMEOUT_S, args=(model_dir,), env=RANK_ENV,
                       backend="nccl")
    assert res["varlen"] and res["equal"], res
