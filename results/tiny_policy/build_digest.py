import hashlib, sys, time, torch
from pathlib import Path
from repro.data.sft import SFTRecipe, train_tiny_policy
out = Path(sys.argv[1]); t=time.time()
rep = train_tiny_policy(SFTRecipe(), out)
h = hashlib.sha256()
for f in sorted(out.glob("*.safetensors")): h.update(f.read_bytes())
print(sys.argv[1], torch.backends.cpu.get_cpu_capability(), rep.get("sft_steps"), rep.get("accuracy_after"), h.hexdigest()[:16], f"{time.time()-t:.0f}s", flush=True)
