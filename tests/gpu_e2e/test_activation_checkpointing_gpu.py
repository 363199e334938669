"""On CUDA, the probe of ``enable_gradient_checkpointing=auto`` (:mod:`repro.workers.activation_checkpointing`) counts
what the forward really leaves allocated for the backward, with the GPU's own attention kernels: torch's SDPA (the
padded path) and the varlen FlashAttention path of remove-padding.

Error model: after a forward whose output is kept, the tensors the forward leaves alive are exactly the saved
tensors' storages and the output (its other intermediates are freed). The caching allocator's ``requested_bytes``
counts what was asked for, before its rounding (to 512-byte blocks, and large blocks reused whole when less than 1 MiB
would be left over: on an H200 the *allocated* growth was 507 KiB above the count, session 20), so the requested
growth minus the output is the probe's count exactly, save the saved storages allocated before the forward (the input
ids). A warm-up forward and backward first, so that cuBLAS's workspace and other first-call allocations are not in the
growth. The CPU suites prove the count against sizes worked out by hand
(``tests/unit/workers/test_activation_checkpointing.py``). Run with ``REPRO_GPU_TESTS=1``.
"""

from __future__ import annotations

import pytest
import torch

from conftest import require_cuda_gpus

pytestmark = pytest.mark.gpu

TOKENS = 1024


@pytest.fixture(autouse=True)
def _cuda():
    require_cuda_gpus(1)


def _storages_saved(forward) -> int:
    seen: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.add(t.untyped_storage().data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    del out
    return len(seen)


@pytest.mark.parametrize("path", ["sdpa", "varlen"])
def test_the_probe_counts_what_the_forward_leaves_allocated_for_the_backward(path, tmp_path):
    from repro.config import ModelConfig
    from repro.data.tiny_model import PolicyShape, build_model, tiny_config
    from repro.workers import activation_checkpointing as ac
    from repro.workers import varlen
    from repro.workers.engine import load_hf_model

    cfg = tiny_config(vocab_size=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      shape=PolicyShape(hidden_size=256, num_hidden_layers=3, intermediate_size=768))
    build_model(cfg, seed=0).save_pretrained(tmp_path, safe_serialization=True)
    model = load_hf_model(ModelConfig(path=str(tmp_path)), torch.bfloat16).cuda().train()
    if path == "varlen":
        if not varlen.supported(torch.bfloat16):
            pytest.skip("no FlashAttention varlen kernel on this machine")
        varlen.enable(model)
    ids = torch.randint(3, 1024, (1, TOKENS), generator=torch.Generator().manual_seed(0)).cuda()
    positions = torch.arange(TOKENS, device="cuda").unsqueeze(0)

    def forward():
        return model(input_ids=ids, position_ids=positions).logits

    forward().float().mean().backward()  # first-call allocations (cuBLAS workspace, kernels' own) out of the way
    model.zero_grad(set_to_none=False)  # the gradients stay allocated, outside the growth below
    n_saved = _storages_saved(forward)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    kept: dict[str, torch.Tensor] = {}

    def forward_kept():
        kept["logits"] = forward()
        return kept["logits"]

    per_token = ac.saved_bytes_per_token(forward_kept, TOKENS, model)
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    output = kept["logits"].untyped_storage().nbytes()
    grown = after["requested_bytes.all.current"] - before["requested_bytes.all.current"] - output
    allocated = after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] - output
    counted = per_token * TOKENS
    assert counted > 0
    # The input ids and positions may be saved (the embedding's backward, the rotary tables) but were allocated
    # before the forward: counted, not grown.
    before_forward = ids.untyped_storage().nbytes() + positions.untyped_storage().nbytes()
    assert grown <= counted <= grown + before_forward, (path, grown, counted, allocated, n_saved)
    print(f"{path}: {per_token / 1024:.1f} KiB/token counted, {grown / TOKENS / 1024:.1f} KiB/token requested, "
          f"{allocated / TOKENS / 1024:.1f} KiB/token allocated, {n_saved} saved storages")
