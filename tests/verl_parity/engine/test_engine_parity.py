"""repro's DeepSpeed engine through verl's engine API = repro's own workers = a one-process reference.

2 gloo ranks, fp32, tiny Qwen3, 3 RL steps of one mini-batch each (the error model is
``harness``'s). One rank run (importing verl's engine package costs ~20 s a process on
2 busy cores, so the run is shared by the module) trains, at each ZeRO stage: the actor and the
critic with fixed micro-batches, the actor with ``use_dynamic_bsz``, and a LoRA actor, each with
the engine and with repro's own worker; at ZeRO-2 also the padded forward
(``use_remove_padding=False``), ``step_each_micro`` (DeepSpeed stepped after every micro-batch), and two
deliberately broken engines that must fail the same check; a forward-only reference engine per
stage; verl's own FSDP2 engine; and last, Ulysses (sp=2).
The engine's numbers are: per-step loss (the ranks' mean of their micro-batch losses, which verl's
losses normalise by the global token count times dp), DeepSpeed's grad norm, the full step-1
gradient (read just before DeepSpeed's step), and the final parameters of its rollout export
(``get_per_tensor_param``). The actor runs also save a checkpoint after step 2, which
``test_engine_checkpoint`` resumes in fresh processes.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.distributed.workers.helpers import make_model_dir
from tests.verl_parity.engine import harness as h

STAGES = (1, 2, 3)
CASES = {
    "actor": {"role": "actor"},
    "critic": {"role": "critic"},
    "actor_dynamic": {"role": "actor", "dynamic": True},
    "actor_lora": {"role": "actor", "lora_rank": 4},
    # offload=cpu: optimizer states on the CPU; at ZeRO-3 the parameters too (param_offload).
    "actor_offload": {"role": "actor", "offload": True},
    "actor_padded": {"role": "actor", "remove_padding": False},
    "actor_step_each_micro": {"role": "actor", "step_each_micro": True},
    # verl steps the schedule (lr_scheduler_step); repro's worker lets DeepSpeed step it: same LRs.
    "actor_cosine": {"role": "actor", "cosine": True},
    # deepspeed.compile_layers (an engine key: verl's model section is verl's): the decoder layers traced by dynamo and
    # run by torch's own kernels (aot_eager: the eager arithmetic), so the reference's bounds hold as they are
    "actor_compiled": {"role": "actor", "compile_layers": "aot_eager"},
}
ONLY_AT_ZERO2 = ("actor_padded", "actor_step_each_micro", "actor_cosine", "actor_compiled")
ONLY_AT_ZERO23 = ("actor_offload",)
# Compared with repro's worker only (the reference's AdamW runs at a constant LR).
REFERENCELESS = ("actor_cosine",)
# repro's own workers run every case they have a config for (the padded forward is the engine's own;
# step_each_micro is VERL_DS_ZERO2_STEP_EACH_MICRO's key: the same update, stepped after every micro-batch).
WORKERLESS = ("actor_padded", "actor_step_each_micro", "actor_compiled")
# The checks must catch these (see _broken_loss): both at ZeRO-2 on the fixed-size actor.
BROKEN = ("double_division", "rank_local_skip")
CHECKPOINTED = ("actor", "actor_lora", "actor_cosine")


def _cases(stage: int) -> list[str]:
    return [c for c in CASES if (stage == 2 or c not in ONLY_AT_ZERO2) and (stage > 1 or c not in ONLY_AT_ZERO23)]


def _engine_kw(case: dict) -> dict:
    keys = ("dynamic", "lora_rank", "remove_padding", "step_each_micro", "cosine", "offload", "compile_layers")
    return {k: case[k] for k in keys if k in case}


def _broken_loss(kind: str, loss_fn, rank: int):
    """verl's loss, broken the way repro's seed was (double division by dp) or as a rank that
    drops its first micro-batch's contribution while still joining every collective."""
    calls = {"n": 0}

    def broken(**kw):
        loss, metrics = loss_fn(**kw)
        calls["n"] += 1
        if kind == "double_division":
            return loss / kw["data"]["dp_size"], metrics
        return (loss * 0.0 if rank == 1 and calls["n"] % 2 == 1 else loss), metrics

    return broken


def _train(rank: int, world: int, model_dir: str, ckpt_root: str) -> dict:
    import time

    from repro.workers.actor import ActorWorker
    from repro.workers.critic import CriticWorker
    from repro.workers.layer_compile import captured_graphs

    out: dict = {}
    for stage in STAGES:
        for name in _cases(stage) + ([f"broken_{b}" for b in BROKEN] if stage == 2 else []):
            t0, graphs_before = time.perf_counter(), captured_graphs()
            case = CASES.get(name, CASES["actor"])
            # The suites switch dynamo off (TORCHDYNAMO_DISABLE=1, conftest.py), which the engine refuses with
            # compile_layers: unset for the compiled case only (graphs_before/after show compiled code ran)
            dynamo_off = os.environ.pop("TORCHDYNAMO_DISABLE", None) if "compile_layers" in case else None
            engine, loss_fn = h.new_engine(model_dir, stage, case["role"], **_engine_kw(case))
            if name.startswith("broken_"):
                loss_fn = _broken_loss(name[len("broken_"):], loss_fn, rank)
            init = h.full_params(engine)
            grads: dict = {}
            h.capture_grads(engine, grads)
            save = (2, f"{ckpt_root}/{name}_zero{stage}") if (stage, name) in _saved() else None
            steps = h.engine_steps(engine, loss_fn, rank, world, remove_padding=case.get("remove_padding", True),
                                   save=save)
            result = {"init": init, "steps": steps, "grads": grads, "final": h.full_params(engine),
                      "offloaded": (engine.is_optimizer_offload_enabled, engine.is_param_offload_enabled,
                                    sorted(k for k in engine.role.ds_config["zero_optimization"] if "offload" in k)),
                      "engaged": engine.role.report(), "setup_line": engine.setup_line(),
                      "graphs": captured_graphs() - graphs_before}  # dynamo's captures in this case's steps
            if dynamo_off is not None:
                os.environ["TORCHDYNAMO_DISABLE"] = dynamo_off
            if name == "actor_lora":  # the LoRA reference: the trained actor with its adapters off
                result["infer"] = h.infer_log_probs(engine, rank, world)
                result["infer_base"] = h.infer_log_probs(engine, rank, world, base=True)
            del engine
            t1 = time.perf_counter()
            if name in CASES and name not in WORKERLESS:
                cfg = h.run_cfg(model_dir, world, stage, dynamic=case.get("dynamic", False),
                                lora_rank=case.get("lora_rank", 0), cosine=case.get("cosine", False),
                                offload=case.get("offload", False))
                worker = CriticWorker(cfg) if case["role"] == "critic" else ActorWorker(cfg)
                result["worker"] = {"steps": h.worker_steps(worker, case["role"], rank, world),
                                    "final": h.full_params(worker)}
                del worker
            out[(stage, name)] = result
            print(f"ZeRO-{stage} {name}: engine {t1 - t0:.1f} s, worker {time.perf_counter() - t1:.1f} s", flush=True)
        # The reference policy: a forward-only engine (ZeRO-3: a DeepSpeed inference engine; else a module).
        ref, _ = h.new_engine(model_dir, stage, "actor", forward_only=True)
        out[(stage, "ref")] = {"infer": h.infer_log_probs(ref, rank, world)}
        del ref
    t0 = time.perf_counter()
    engine, loss_fn = h.new_fsdp2_engine(model_dir)
    out[("fsdp2", "actor")] = {"steps": h.engine_steps(engine, loss_fn, rank, world), "final": h.full_params(engine)}
    print(f"verl FSDP2 actor: {time.perf_counter() - t0:.1f} s", flush=True)
    # Last: Ulysses sets process-wide sequence-parallel groups that no later engine should see.
    engine, loss_fn = h.new_engine(model_dir, 2, "actor", sp=2)
    grads: dict = {}
    h.capture_grads(engine, grads)
    out[(2, "actor_ulysses")] = {"init": h.full_params(engine), "steps": h.engine_steps(engine, loss_fn, rank, world),
                                 "grads": grads, "final": h.full_params(engine), "engaged": engine.role.report(),
                                 "setup_line": engine.setup_line()}
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    from tests.multirank import run_ranks

    root = tmp_path_factory.mktemp("engine_parity")
    model_dir = make_model_dir(root / "model")
    results = run_ranks(_train, 2, tmp_path=root, timeout_s=900, args=(model_dir, str(root / "ckpt")))
    return {"model_dir": model_dir, "ckpt": root / "ckpt", "ranks": results}


def _mean_over_ranks(ranks: list[dict]) -> list[dict]:
    return [{"loss": sum(r["steps"][i]["loss"] for r in ranks) / len(ranks), "grad_norm": ranks[0]["steps"][i]["grad_norm"]}
            for i in range(h.STEPS)]


# One reference run per case: it is the same at every stage (same data, same initial weights).
_REFERENCE_RUNS: dict = {}


def check_case(ranks: list[dict], name: str, model_dir: str, case_name: str | None = None) -> None:
    """Every comparison of one engine run (AssertionError naming the first mismatch).

    ``case_name``: the configuration the run claims to be (a broken run claims ``actor``).
    """
    case_name = case_name or name
    case = CASES[case_name]
    n_params = sum(t.numel() for t in ranks[0]["final"].values())
    for r in ranks[1:]:  # DeepSpeed's grad norm and the rollout export are global: ranks agree bitwise
        assert [s["grad_norm"] for s in r["steps"]] == [s["grad_norm"] for s in ranks[0]["steps"]], name
        h.assert_params_close(f"{name} rank parity", r["final"], ranks[0]["final"], tol=0.0)
    if case_name in REFERENCELESS:
        worker = ranks[0]["worker"]
        assert [s["lr"] for s in ranks[0]["steps"]] == [s["lr"] for s in worker["steps"]], (name, "LRs")
        assert len({s["lr"] for s in worker["steps"]}) > 1, (name, "the schedule does not move")
        for i, (g, w) in enumerate(zip(ranks[0]["steps"], worker["steps"], strict=True)):
            h.assert_close(f"{name} engine vs repro worker step {i + 1} grad_norm", g["grad_norm"], w["grad_norm"],
                           h.norm_tol(w["grad_norm"], n_params))
        h.assert_params_close(f"{name} engine vs repro worker parameters", ranks[0]["final"], worker["final"],
                              h.params_tol([s["grad_norm"] for s in worker["steps"]], worker["final"]))
        return
    key = (model_dir, case_name)
    if key not in _REFERENCE_RUNS:
        cfg = h.run_cfg(model_dir, 2, 2, dynamic=case.get("dynamic", False), lora_rank=case.get("lora_rank", 0))
        _REFERENCE_RUNS[key] = h.reference_run(cfg, case["role"], ranks[0]["init"], lora_rank=case.get("lora_rank", 0))
    want_steps, want_grads, want_final = _REFERENCE_RUNS[key]
    h.assert_steps_close(f"{name} engine vs reference", _mean_over_ranks(ranks), want_steps, n_params)
    got_grads = ranks[0]["grads"]
    grads = {k: v for k, v in want_grads.items() if k in got_grads} if case.get("lora_rank") else want_grads
    h.assert_params_close(f"{name} engine vs reference step-1 gradient", got_grads, grads, h.grads_tol(grads))
    h.assert_params_close(f"{name} engine vs reference parameters", ranks[0]["final"], want_final,
                          h.params_tol([s["grad_norm"] for s in want_steps], want_final))
    if "worker" in ranks[0]:
        worker = ranks[0]["worker"]
        for i, (g, w) in enumerate(zip(ranks[0]["steps"], worker["steps"], strict=True)):
            h.assert_close(f"{name} engine vs repro worker step {i + 1} grad_norm", g["grad_norm"], w["grad_norm"],
                           h.norm_tol(w["grad_norm"], n_params))
        h.assert_params_close(f"{name} engine vs repro worker parameters", ranks[0]["final"], worker["final"],
                              h.params_tol([s["grad_norm"] for s in worker["steps"]], worker["final"]))


def assert_engaged(engaged: dict, stage: int, case: dict, sp: int = 1) -> None:
    """The features a case claims, read back from the engine it ran (``RoleEngine.report``,
    ``repro.workers.engaged``), not from the config it was given."""
    label = (stage, case, engaged)
    assert engaged["stage"] == stage, label
    offload = case.get("offload", False)
    assert engaged["optimizer"] == ("cpu_offload" if offload else "device"), label
    assert engaged["param"] == ("cpu_offload" if offload and stage == 3 else "device"), label
    lora = case.get("lora_rank", 0) > 0
    # ZeRO-3 fetches each decoder layer whole (the engine's default), except for a LoRA model.
    assert engaged["zero3_leaves"] == (["Qwen3DecoderLayer"] * 2 if stage == 3 and not lora else []), label
    assert engaged["zero3_hooked_in_leaves"] == 0, label
    assert (engaged["lora_layers"] > 0) == lora and engaged["optimizer_base_params"] == (
        0 if lora else engaged["optimizer_params"]), label
    # verl's packed rows (use_remove_padding) reach the model without a mask; the padded path with one.
    fed = engaged["fed"]
    packed = case.get("remove_padding", True) or sp > 1
    assert fed["forwards"] > 0 and fed["masked"] == (0 if packed else fed["forwards"]), label
    assert engaged["sp"] == sp, label
    # compiled decoder layers counted on the engine's module (both of the tiny model's), none unless asked
    assert engaged["compiled_layers"] == (2 if case.get("compile_layers", "off") != "off" else 0), label
    if sp > 1:
        assert engaged["attention"] == "repro_ulysses_actor", label


@pytest.mark.parametrize("stage,name", [(s, c) for s in STAGES for c in _cases(s)])
def test_engine_matches_workers_and_reference(trained: dict, stage: int, name: str) -> None:
    ranks = [r[(stage, name)] for r in trained["ranks"]]
    if name == "actor_offload":  # verl's train/eval contexts saw the stage-aware offload
        want = ["offload_optimizer"] + (["offload_param"] if stage == 3 else [])  # what DeepSpeed was given
        assert ranks[0]["offloaded"] == (True, stage == 3, want)
    for rank in ranks:
        assert_engaged(rank["engaged"], stage, CASES[name])
    # dynamo captured the layers' graphs in the compiled case's steps (compiled code ran), none in another's
    assert all((rank["graphs"] > 0) == (name == "actor_compiled") for rank in ranks), [r["graphs"] for r in ranks]
    check_case(ranks, name, trained["model_dir"])


@pytest.mark.parametrize("stage", STAGES)
def test_infer_batch_reference_and_disable_adapter(trained: dict, stage: int) -> None:
    """verl's log-prob path (eval_mode + infer_batch, no loss): a forward-only engine (the reference
    policy) and a trained LoRA actor under ``disable_adapter`` both give the untrained model's
    log-probs (``forward_tol``); with its adapters on, the trained LoRA actor does not."""
    want = h.reference_log_probs(trained["model_dir"])
    for rank, r in enumerate(trained["ranks"]):
        mine = want.chunk(2)[rank]  # the contiguous share ``shard`` gives each rank
        for label, got in (("ref engine", r[(stage, "ref")]["infer"]),
                           ("LoRA actor, adapters off", r[(stage, "actor_lora")]["infer_base"])):
            diff = float((got - mine).abs().max())
            assert diff <= h.forward_tol(mine), f"ZeRO-{stage} rank {rank} {label}: log-probs differ by {diff:.3g}"
        moved = float((r[(stage, "actor_lora")]["infer"] - mine).abs().max())
        assert moved > 1e-4, f"ZeRO-{stage}: the trained adapters do not change the log-probs ({moved:.3g})"


def test_ulysses_engine_matches_the_reference(trained: dict) -> None:
    """ZeRO-2 with a Ulysses group of both ranks (sp=2, dp=1): each rank forwards half of every
    packed row; the same numbers as the reference (the ranks' mean loss is the whole loss here)."""
    ranks = [r[(2, "actor_ulysses")] for r in trained["ranks"]]
    for rank in ranks:
        assert_engaged(rank["engaged"], 2, CASES["actor"], sp=2)
    assert [s["grad_norm"] for s in ranks[1]["steps"]] == [None] * h.STEPS  # verl: outputs on sp rank 0 only
    h.assert_params_close("Ulysses rank parity", ranks[1]["final"], ranks[0]["final"], tol=0.0)
    assert ranks[0]["setup_line"] == ("repro DeepSpeed engine, actor: ZeRO-2, offload (read back) optimizer=device "
                                      "param=device, dp 1 x sp 2 (read back sp 2), attention repro_ulysses_actor")
    check_case(ranks[:1], "actor_ulysses", trained["model_dir"], case_name="actor")


def test_verl_fsdp2_engine_matches_the_reference_and_the_deepspeed_engine(trained: dict) -> None:
    """verl's own FSDP2 engine, same actor run on the same CPU ranks: the same numbers within the error model.

    Its log-probs are verl's ``logprobs_from_logits`` (not repro's chunked ones) and its gradient
    reduction is FSDP2's reduce-scatter: summation order only, inside the same error model.
    """
    fsdp = [dict(r[("fsdp2", "actor")]) for r in trained["ranks"]]
    h.assert_params_close("FSDP2 rank parity", fsdp[1]["final"], fsdp[0]["final"], tol=0.0)
    # The tiny Qwen3 ties its LM head to the embedding: FSDP's state_dict lists the tied name too.
    final = dict(fsdp[0]["final"])
    tied = final.pop("lm_head.weight")
    assert bool((tied == final["model.embed_tokens.weight"]).all())
    fsdp[0]["final"] = final
    check_case([r[(2, "actor")] for r in trained["ranks"]], "actor", trained["model_dir"])  # fills the reference
    want_steps, _, want_final = _REFERENCE_RUNS[(trained["model_dir"], "actor")]
    n_params = sum(t.numel() for t in want_final.values())
    p_tol = h.params_tol([s["grad_norm"] for s in want_steps], want_final)
    h.assert_steps_close("verl FSDP2 vs reference", _mean_over_ranks(fsdp), want_steps, n_params)
    h.assert_params_close("verl FSDP2 vs reference parameters", fsdp[0]["final"], want_final, p_tol)
    for stage in STAGES:
        ds = [r[(stage, "actor")] for r in trained["ranks"]]
        # Each within the bound of the reference, so of each other within twice it.
        h.assert_steps_close(f"verl FSDP2 vs DeepSpeed ZeRO-{stage}", _mean_over_ranks(fsdp), _mean_over_ranks(ds),
                             n_params, scale=2.0)
        h.assert_params_close(f"verl FSDP2 vs DeepSpeed ZeRO-{stage} parameters", fsdp[0]["final"], ds[0]["final"],
                              2 * p_tol)


@pytest.mark.parametrize("kind", BROKEN)
def test_broken_engine_fails_the_check(trained: dict, kind: str) -> None:
    """The same check on a deliberately broken engine run must fail (so the check can fail)."""
    ranks = [r[(2, f"broken_{kind}")] for r in trained["ranks"]]
    with pytest.raises(AssertionError, match="engine vs reference"):
        check_case(ranks, f"broken_{kind}", trained["model_dir"], case_name="actor")


def _resume(rank: int, world: int, model_dir: str, ckpt_root: str, stage: int, name: str) -> dict:
    case = CASES[name]
    engine, loss_fn = h.new_engine(model_dir, stage, case["role"], **_engine_kw(case))
    engine.load_checkpoint(f"{ckpt_root}/{name}_zero{stage}")
    steps = h.engine_steps(engine, loss_fn, rank, world, steps=range(2, h.STEPS))
    return {"steps": steps, "final": h.full_params(engine)}


def _saved() -> list[tuple[int, str]]:
    return [(s, n) for s in STAGES for n in _cases(s) if n in CHECKPOINTED and s > 1]


def _resume_all(rank: int, world: int, model_dir: str, ckpt_root: str, damaged: str) -> dict:
    out = {(s, n): _resume(rank, world, model_dir, ckpt_root, s, n) for s, n in _saved()}
    engine, _ = h.new_engine(model_dir, 2, "actor")
    try:
        engine.load_checkpoint(damaged)
        out["damaged"] = "loaded"
    except ValueError as err:
        out["damaged"] = str(err)
    return out


def test_engine_checkpoint_resumes_bitwise(trained: dict, tmp_path: pathlib.Path) -> None:
    """save_checkpoint after step 2 (in the parity run), load in fresh processes: step 3 is bitwise the same.
    A copy with one byte of a DeepSpeed file flipped is refused on every rank (its manifest)."""
    import shutil

    from tests.multirank import run_ranks

    damaged = tmp_path / "damaged"
    shutil.copytree(trained["ckpt"] / "actor_zero2", damaged)
    victim = max((p for p in damaged.rglob("*.pt") if "/ds/" in p.as_posix()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    resumed = run_ranks(_resume_all, 2, tmp_path=tmp_path, timeout_s=600,
                        args=(trained["model_dir"], str(trained["ckpt"]), str(damaged)))
    for rank in range(2):
        message = resumed[rank].pop("damaged")
        assert "does not match its manifest" in message and victim.name in message, (rank, message)
    for key in resumed[0]:
        for rank, got in enumerate(resumed):
            want = trained["ranks"][rank][key]
            assert got[key]["steps"] == want["steps"][2:], (key, rank, got[key]["steps"], want["steps"][2:])
            h.assert_params_close(f"{key} resumed step 3", got[key]["final"], want["final"], tol=0.0)


@pytest.mark.parametrize("stage,name,words", [
    (2, "actor", "actor: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1, attention "),
    (3, "actor_offload", "actor: ZeRO-3, offload (read back) optimizer=cpu param=cpu, dp 2 x sp 1, attention "),
    (2, "critic", "critic: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1, attention "),
    (2, "actor_compiled", "actor: ZeRO-2, offload (read back) optimizer=device param=device, dp 2 x sp 1, attention "),
])
def test_the_engine_line_says_what_the_built_engine_reports(trained: dict, stage: int, name: str, words: str) -> None:
    """Rank 0 prints this line when the engine is built: verl's console shows the config it composed, and this
    line what the engine made of it (ZeRO-3's offload of both, read back, not the ``offload=cpu`` asked)."""
    rank = trained["ranks"][0][(stage, name)]
    assert rank["setup_line"].startswith("repro DeepSpeed engine, " + words), rank["setup_line"]
    assert "RMSNorm" not in rank["setup_line"]  # eager norms on a CPU (rms_norm.fused_count is 0)
    assert ("compiled layers (read back: 2)" in rank["setup_line"]) == (name == "actor_compiled"), rank["setup_line"]
    # ZeRO-3's layout, read back as repro's banner words it (repro.run.banner.zero3_words); none below ZeRO-3
    engaged = rank["engaged"]
    zero3 = (f"ZeRO-3 read back [{len(engaged['zero3_leaves'])} leaf modules, linear {engaged['linear']}, "
             f"{engaged['zero3_persistent_params']} parameters whole")
    assert (zero3 in rank["setup_line"]) == (stage == 3), rank["setup_line"]
    assert (f"{engaged['zero3_hooked_modules']} modules hooked]" in rank["setup_line"]) == (stage == 3)


def test_the_lora_engine_line_counts_adapters_and_no_base_parameter(trained: dict) -> None:
    line, engaged = (trained["ranks"][0][(2, "actor_lora")][k] for k in ("setup_line", "engaged"))
    assert line.endswith(f", LoRA (read back: {engaged['lora_layers']} adapter layers, 0 base params in the optimizer)")
    assert engaged["lora_layers"] > 0
