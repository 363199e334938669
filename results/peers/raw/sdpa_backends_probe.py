import sys, time, torch
from transformers import AutoModelForCausalLM
from torch.nn.attention import sdpa_kernel, SDPBackend
from repro.bench.rollout import make_policy_dir
from pathlib import Path
md = make_policy_dir(Path("/tmp/rb"))
m = AutoModelForCausalLM.from_pretrained(md, dtype=torch.bfloat16).cuda().eval()
eos, pad = m.config.eos_token_id, m.config.pad_token_id
g = torch.Generator().manual_seed(0)
def run(b, width, new, backends):
    ids = torch.randint(3, m.config.vocab_size, (b, width), generator=g).cuda()
    mask = torch.ones_like(ids); mask[: b // 2, : width // 3] = 0
    torch.cuda.synchronize(); t = time.time()
    with torch.no_grad(), sdpa_kernel(backends):
        m.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                   max_new_tokens=new, eos_token_id=eos, pad_token_id=pad, min_new_tokens=new)
    torch.cuda.synchronize(); return (time.time() - t) / new * 1e3
sets = {"default(cudnn)": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
        "flash,efficient": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
        "efficient": [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]}
run(4, 16, 8, sets["flash,efficient"])
for width in (100, 300, 500):   # a new prompt width each round: cold shapes for the cudnn plan cache
    for name, be in sets.items():
        for rnd in ("cold", "warm"):
            ms = run(128, width + (1 if name == "flash,efficient" else 2 if name == "efficient" else 0), 128, be)
            print(f"width {width} {name:16s} {rnd}: {ms:.1f} ms/decode step (batch 128, 128 new)", flush=True)
