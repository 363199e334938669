"""Max differences behind the exactness table of results/sp_rmpad_lora/README.md (2 gloo ranks, fp32).

Runs the same cases as tests/distributed/workers/test_remove_padding.py and test_ulysses.py and
prints the measured maxima instead of asserting them:

    PYTHONPATH=$PWD DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 python results/sp_rmpad_lora/exactness.py
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from repro.algorithms import logprobs_from_logits
    from tests.distributed.workers import test_remove_padding as rp
    from tests.distributed.workers import test_ulysses as ul
    from tests.distributed.workers.helpers import make_model_dir, make_step_batch, shard
    from tests.multirank import run_ranks

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="h10_exact_"))
    model_dir = make_model_dir(tmp / "model")
    rows = []
    for stage in (1, 2, 3):
        for role in ("actor", "critic"):
            res = run_ranks(rp._run, 2, tmp_path=tmp / f"rp{stage}{role}", timeout_s=300,
                            args=(model_dir, stage, role))
            for dynamic in (False, True):
                fwd = par = 0.0
                for rank in range(2):
                    mask = shard(make_step_batch(31, rp.SAMPLES), rank, 2)["response_mask"].bool()
                    cases = {(r["dynamic"], r["rmpad"]): r for r in res[rank]}
                    off, on = cases[(dynamic, False)], cases[(dynamic, True)]
                    for key in off["forward"]:
                        fwd = max(fwd, (off["forward"][key][mask] - on["forward"][key][mask]).abs().max().item())
                    par = max(par, max((off["params"][k] - on["params"][k]).abs().max().item() for k in off["params"]))
                micro = "token-budget" if dynamic else "fixed"
                rows.append((f"remove-padding on vs off, ZeRO-{stage}, {role}, {micro} micro-batches", fwd, par))
    model = None
    for stage in (1, 2, 3):
        for role in ("actor", "critic"):
            res = run_ranks(ul._run, 2, tmp_path=tmp / f"ul{stage}{role}", timeout_s=300,
                            args=(model_dir, stage, role, None))
            want_params, want_norms = ul._reference(model_dir, role, stage)
            full = make_step_batch(41, ul.SAMPLES)
            if role == "actor" and model is None:
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
                with torch.no_grad():
                    logits = model(input_ids=full["input_ids"], attention_mask=full["attention_mask"],
                                   position_ids=full["position_ids"]).logits[:, -full["responses"].shape[1] - 1:-1]
                want_lp = logprobs_from_logits(logits, full["responses"])
            for rmpad in (False, True):
                fwd, par, norm = 0.0, 0.0, 0.0
                for rank in range(2):
                    r = next(x for x in res[rank] if x["rmpad"] == rmpad)
                    rows_ = slice(rank * 4, rank * 4 + 4)
                    mask = full["response_mask"][rows_].bool()
                    if role == "actor":
                        fwd = max(fwd, (r["forward"]["log_probs"][mask] - want_lp[rows_][mask]).abs().max().item())
                    par = max(par, max((r["params"][k] - want_params[k]).abs().max().item() for k in want_params))
                    norm = max(norm, abs(r["grad_norm"] - sum(want_norms) / 2))
                layout = "packed rows" if rmpad else "left+right padding"
                rows.append((f"sp=2 dp=1 vs single process, ZeRO-{stage}, {role}, {layout} (grad-norm diff {norm:.1e})",
                             fwd if role == "actor" else float("nan"), par))
    print("config\tmax forward diff (log-probs, entropy or values)\tmax param diff after the updates")
    for name, fwd, par in rows:
        print(f"{name}\t{fwd:.2e}\t{par:.2e}")


if __name__ == "__main__":
    main()
