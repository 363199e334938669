"""The tiny policy as shipped files: the same model on every machine.

The tiny policy's SFT build is bitwise reproducible on one machine but not across CPU models:
PyTorch's vectorised kernels (chosen by the CPU's instruction set) and MKL's GEMM path each change
the last bits of a step, and 240 Adam steps turn them into another model (four builds, four
policies on one machine: results/tiny_policy/README.md). So the default recipe's policy ships in
``repro/data/tiny_policy_weights/`` (4 MB): the build of ``SFTRecipe()`` on the machine that
:data:`BUILT_ON` describes. ``repro.data.sft.ensure_tiny_policy`` copies it into the cache instead
of training, checking every file against :data:`SHA256`; a changed file is an error, never a
silent rebuild. ``tests/unit/data/test_sft.py`` rebuilds it by SFT where the CPU's kernel paths
are :data:`BUILT_ON`'s and compares the bytes, so the shipped weights stay the recipe's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).with_name("tiny_policy_weights")
REPORT = "repro_tiny_policy.json"
SHA256 = {
    "chat_template.jinja": "c4123e078b4bdc0f5f63fa38eca171496c1d7ee48987353469d9d611d0428e66",
    "config.json": "822cce0d198e98309358a79841634a714577e7b11b627334da06903618ed6d3c",
    "generation_config.json": "ec36960ffaccb09d682bc355b89a64a969a16417de96d64350fcb66aebaec7eb",
    "model.safetensors": "c3fd17e62f468bbc4e4cbda47dcf62cc099d7cd0f12d134fee3d5df56dbe18b8",
    REPORT: "4af11ae08f9a8d52aa77228be505d75036ccfb197e21660c09bfb4e2a8a38ac4",
    "tokenizer.json": "4d5075ef264512a458bc534c4c0655a84c03667bd8fab157c83ecace241cea31",
    "tokenizer_config.json": "37c531b96e09689b4c249456c2f729fce9b1bd3f1206ad8b4d6a2f6155ff6707",
}
# The instruction-set extensions ATen and MKL choose kernels by (as /proc/cpuinfo spells them).
KERNEL_FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx2", "avx512_bf16", "avx512_fp16", "avx512_vbmi2", "avx512_vnni",
                "avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512ifma", "avx512vbmi", "avx512vl", "avx_vnni",
                "f16c", "fma")
# What decides the build's arithmetic on a CPU (kernel_paths()) where the shipped files were built: the
# 2-core CI machine kind ("Intel(R) Xeon(R) Processor", one thread); rebuilt there byte for byte on
# 2026-11-27 (results/tiny_policy/README.md).
BUILT_ON = {"torch": "2.13.0+cpu", "cpu_capability": "AVX512", "cpu_flags": list(KERNEL_FLAGS)}


def kernel_paths() -> dict[str, Any]:
    """This machine's torch, ATen CPU capability and the instruction-set flags MKL and ATen dispatch on."""
    import torch

    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": [f for f in KERNEL_FLAGS if f in flags]}


def serves(recipe: Any, device_type: str, folder: str) -> bool:
    """Whether the build of ``recipe`` (an ``SFTRecipe``) on ``device_type`` into cache ``folder`` is the
    shipped policy: the recipe its report records, on CPU."""
    shipped = json.loads((FOLDER / REPORT).read_text())["recipe"]
    return device_type == "cpu" and folder == "tiny-policy" and json.loads(json.dumps(recipe.as_dict())) == shipped


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def materialize(out: Path, key: str) -> dict[str, Any]:
    """Copy the shipped policy into ``out`` (checked file by file); its report says where it came from."""
    bad = sorted(name for name, digest in SHA256.items() if not (FOLDER / name).is_file()
                 or _sha256(FOLDER / name) != digest)
    if bad:
        raise RuntimeError(f"the shipped tiny policy in {FOLDER} is damaged or incomplete: {bad} do not match "
                           "their sha256 in repro/data/tiny_fixture.py (reinstall repro)")
    for name in SHA256:
        if name != REPORT:
            shutil.copyfile(FOLDER / name, out / name)
    report = json.loads((FOLDER / REPORT).read_text())
    # The cache key covers the library versions; the shipped weights are data and load under any of them.
    report.update({"built_key": report["key"], "key": key, "source": f"shipped ({FOLDER.name}, built on {BUILT_ON})"})
    (out / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return report
