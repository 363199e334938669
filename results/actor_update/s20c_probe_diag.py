"""Issue 35, session 20: where the CUDA allocator's growth over a kept forward and the auto-checkpointing probe's
count differ (tests/gpu_e2e/test_activation_checkpointing_gpu.py failed on an H200 with 507 KiB more allocated than
counted, 1.5%, in both the SDPA and the varlen path). Lists every allocation the kept forward leaves alive with its
requested and its block size, marks those the probe counted (a saved storage) and the output, and prints the
allocation stack of the rest. One GPU: `python3 results/actor_update/s20c_probe_diag.py`."""

from __future__ import annotations

import tempfile

import torch

from repro.config import ModelConfig
from repro.data.tiny_model import PolicyShape, build_model, tiny_config
from repro.workers import varlen
from repro.workers.engine import load_hf_model

TOKENS = 1024


def live_blocks() -> dict[int, dict]:
    return {b["address"]: b for seg in torch.cuda.memory_snapshot() for b in seg["blocks"]
            if b["state"] == "active_allocated"}


def main(path: str) -> None:
    tmp = tempfile.mkdtemp()
    cfg = tiny_config(vocab_size=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=256, num_hidden_layers=3, intermediate_size=768))
    build_model(cfg, seed=0).save_pretrained(tmp, safe_serialization=True)
    model = load_hf_model(ModelConfig(path=tmp), torch.bfloat16).cuda().train()
    if path == "varlen":
        varlen.enable(model)
    ids = torch.randint(3, 1024, (1, TOKENS), generator=torch.Generator().manual_seed(0)).cuda()
    positions = torch.arange(TOKENS, device="cuda").unsqueeze(0)
    model(input_ids=ids, position_ids=positions).logits.float().mean().backward()
    model.zero_grad(set_to_none=False)
    torch.cuda.synchronize()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    torch.cuda.memory._record_memory_history(max_entries=200000)
    before_blocks = live_blocks()
    stats0 = torch.cuda.memory_stats()
    saved: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.nbytes():
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, position_ids=positions).logits
    torch.cuda.synchronize()
    stats1 = torch.cuda.memory_stats()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    after_blocks = {b["address"]: b for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"}
    new = {a: b for a, b in after_blocks.items() if a not in before_blocks}
    counted = sum(n for p, n in saved.items() if p not in before_blocks)
    print(f"== {path}: allocated growth {stats1['allocated_bytes.all.current'] - stats0['allocated_bytes.all.current']}, "
          f"requested growth {stats1['requested_bytes.all.current'] - stats0['requested_bytes.all.current']}, "
          f"saved storages {len(saved)} ({sum(saved.values())} bytes, {counted} of them new), "
          f"output {out.untyped_storage().nbytes()}")
    rows = []
    for a, b in sorted(new.items(), key=lambda kv: -kv[1]["size"]):
        kind = "output" if a == out.untyped_storage().data_ptr() else ("saved" if a in saved else "NOT COUNTED")
        rows.append((kind, b["requested_size"], b["size"], a))
    for kind in ("saved", "output", "NOT COUNTED"):
        sel = [r for r in rows if r[0] == kind]
        print(f"{kind}: {len(sel)} blocks, requested {sum(r[1] for r in sel)}, block size {sum(r[2] for r in sel)}")
    for kind, req, size, a in rows:
        if kind == "NOT COUNTED":
            frames = new[a].get("frames") or []
            where = " <- ".join(f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in frames
                                if f["filename"].endswith(".py") and "site-packages/torch/" not in f["filename"])[:700]
            print(f"  NOT COUNTED requested {req} block {size}: {where}")
    missing = [p for p in saved if p not in after_blocks and p not in before_blocks]
    print(f"saved storages not at a block start: {len(missing)} ({sum(saved[p] for p in missing)} bytes)")


if __name__ == "__main__":
    for p in ("sdpa", "varlen"):
        main(p)
