"""The reference rollout: padded layout, EOS handling, seeded sampling, weight sync, vllm error."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from repro.config import RunConfig
from repro.data.tiny_model import build_model, save_model, tiny_config
from repro.data.tokenizer import build_tokenizer, save_tokenizer
from repro.workers.rollout_hf import HFRollout, make_rollout


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    tok = build_tokenizer()
    model = build_model(tiny_config(len(tok), tok.pad_token_id, tok.bos_token_id, tok.eos_token_id), seed=0)
    save_model(model, out)
    save_tokenizer(out)
    return out, model, tok


def _rollout(model_dir, response_length: int = 10) -> HFRollout:
    path, model, _ = model_dir
    cfg = RunConfig()
    cfg.actor_rollout_ref.model.path = str(path)
    cfg.data.max_response_length = response_length
    r = HFRollout(cfg)
    r.load_weights(model.state_dict().items())
    return r


def _prompts(tok):
    return [tok(q, add_special_tokens=False)["input_ids"] for q in ("Q: 23+4=? A:", "Q: 5+1=? A:")]


def test_batch_layout_left_pads_prompts_and_masks_everything_after_first_eos(model_dir):
    r = _rollout(model_dir)
    tok = model_dir[2]
    prompts = _prompts(tok)
    b = r.generate(prompts, n=3, seed=7, prompt_pad_to=14)
    assert b["input_ids"].shape == (6, 24) and b["responses"].shape == (6, 10)
    for i in range(6):
        p = prompts[i // 3]
        assert b["input_ids"][i, 14 - len(p):14].tolist() == p
        assert b["attention_mask"][i, :14].sum().item() == len(p)
        resp, mask = b["responses"][i].tolist(), b["response_mask"][i].tolist()
        length = sum(mask)
        assert mask == [1] * length + [0] * (10 - length)
        assert tok.eos_token_id not in resp[: length - 1]
        if length < 10:
            assert resp[length - 1] == tok.eos_token_id
            assert all(t == tok.pad_token_id for t in resp[length:])
    assert torch.equal(b["input_ids"][:, 14:], b["responses"])
    real = b["attention_mask"].bool()
    assert torch.equal(b["position_ids"][real], torch.cat([torch.arange(n) for n in real.sum(1).tolist()]))


def test_same_seed_gives_same_samples_and_another_seed_differs(model_dir):
    r = _rollout(model_dir)
    prompts = _prompts(model_dir[2])
    a = r.generate(prompts, n=4, seed=1)
    b = r.generate(prompts, n=4, seed=1)
    c = r.generate(prompts, n=4, seed=2)
    assert torch.equal(a["responses"], b["responses"])
    assert not torch.equal(a["responses"], c["responses"])


def test_sampling_does_not_touch_the_global_rng(model_dir):
    r = _rollout(model_dir)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    r.generate(_prompts(model_dir[2]), n=2, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_synced_weights_drive_generation(model_dir):
    path, model, tok = model_dir
    r = _rollout(model_dir)
    prompts = _prompts(tok)
    greedy = r.generate(prompts, n=1, do_sample=False)
    ids = torch.tensor([prompts[0]])
    ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)[0, ids.shape[1]:]
    assert greedy["responses"][0, : len(ref)].tolist()[: int(greedy["response_mask"][0].sum())] == \
        ref.tolist()[: int(greedy["response_mask"][0].sum())]
    other = build_model(model.config, seed=123)
    r.load_weights(other.state_dict().items())
    with torch.no_grad():
        assert torch.equal(r.model(input_ids=ids).logits, other(input_ids=ids).logits)
        assert not torch.equal(r.model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_unknown_weight_name_is_refused(model_dir):
    r = _rollout(model_dir)
    with pytest.raises(KeyError, match="not a parameter"):
        r.load_weights([("model.no_such.weight", torch.zeros(1))])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_rollout_without_vllm_suggests_hf(model_dir):
    cfg = RunConfig()
    cfg.actor_rollout_ref.model.path = str(model_dir[0])
    cfg.actor_rollout_ref.rollout.name = "vllm"
    with pytest.raises(ValueError, match="rollout.name=hf"):
        make_rollout(cfg)


def test_greedy_generation_is_the_same_in_micro_batches(model_dir):
    r = _rollout(model_dir)
    prompts = _prompts(model_dir[2]) * 2
    whole = r.generate(prompts, n=1, do_sample=False, prompt_pad_to=14)
    chunked = r.generate(prompts, n=1, do_sample=False, prompt_pad_to=14, micro_batch_size=1)
    assert all(torch.equal(whole[k], chunked[k]) for k in whole)


def _logprob_rollout(model_dir, **sampling) -> HFRollout:
    r = _rollout(model_dir)
    r.return_log_probs = True
    for key, value in sampling.items():
        setattr(r.cfg.actor_rollout_ref.rollout, key, value)
    return r


def _full_forward_log_probs(model, b, temperature: float) -> torch.Tensor:
    """The trainer's view: one forward of prompt + response, log-softmax of logits / temperature."""
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits
    width = b["responses"].shape[1]
    scaled = logits[:, -width - 1:-1].float() / temperature
    return torch.log_softmax(scaled, -1).gather(-1, b["responses"][..., None]).squeeze(-1)


def test_rollout_log_probs_only_when_asked(model_dir):
    assert "rollout_log_probs" not in _rollout(model_dir).generate(_prompts(model_dir[2]), n=2, seed=3)


def test_rollout_log_probs_match_a_full_forward_at_the_sampling_temperature(model_dir):
    # Same fp32 weights; the rollout decodes with a KV cache, the forward sees the whole sequence:
    # only reduction order differs. Per logit that is a few ulps of the fp32 matmul sums (hidden 64,
    # |logit| < 10: ~1e-6), and log-softmax moves by at most twice the largest logit change, so
    # 1e-5 holds with room; a wrong temperature (0.7 vs 1.0) moves them by ~0.1.
    _, model, tok = model_dir
    r = _logprob_rollout(model_dir, temperature=0.7)
    b = r.generate(_prompts(tok), n=3, seed=7)
    mask = b["response_mask"].bool()
    assert torch.all(b["rollout_log_probs"][~mask] == 0)
    diff = (b["rollout_log_probs"] - _full_forward_log_probs(model, b, 0.7))[mask].abs().max().item()
    assert diff < 1e-5
    wrong = (b["rollout_log_probs"] - _full_forward_log_probs(model, b, 1.0))[mask].abs().max().item()
    assert wrong > 1e-2


def test_rollout_log_probs_are_after_top_k_like_vllm_processed_logprobs(model_dir):
    # Top-k renormalizes over the k kept tokens, so each sampled token's processed log-prob is
    # its full log-prob minus log(mass of the top k), never below the full one and never -inf.
    _, model, tok = model_dir
    r = _logprob_rollout(model_dir, top_k=3)
    b = r.generate(_prompts(tok), n=3, seed=7)
    mask = b["response_mask"].bool()
    full = _full_forward_log_probs(model, b, 1.0)
    rollout = b["rollout_log_probs"]
    assert torch.isfinite(rollout).all()
    assert torch.all(rollout[mask] >= full[mask] - 1e-5)
    assert (rollout[mask] - full[mask]).max().item() > 1e-2
