"""vLLM-style token lists (ending at EOS) give exactly the batch HF ``generate``'s padded output gives.

HF ``generate`` returns each row right-padded with ``pad`` after its EOS (and may run on past it
in a batch); vLLM returns each sample's tokens up to and including EOS. Both go through
``rollout_layout``: the same samples must give the same batch either way.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.workers import rollout_layout as layout

PAD, EOS = 0, 1
TOKENS = st.integers(min_value=2, max_value=40)  # neither pad nor EOS


@st.composite
def _case(draw):
    n = draw(st.integers(min_value=1, max_value=3))
    length = draw(st.integers(min_value=1, max_value=8))
    prompts = draw(st.lists(st.lists(TOKENS, min_size=1, max_size=6), min_size=1, max_size=4))
    samples = []
    for _ in range(len(prompts) * n):
        if draw(st.booleans()):  # vLLM: stops at EOS (kept), or at max_tokens without one
            samples.append(draw(st.lists(TOKENS, max_size=length - 1)) + [EOS])
        else:
            samples.append(draw(st.lists(TOKENS, min_size=length, max_size=length)))
    pad_to = draw(st.one_of(st.none(), st.integers(min_value=6, max_value=9)))
    return prompts, samples, n, length, pad_to


def _hf_generate_rows(samples, length, junk):
    """What HF generate returns: tokens, then ``junk`` after an EOS (batch decoding runs on), then pad."""
    rows = torch.full((len(samples), length), PAD, dtype=torch.long)
    for i, s in enumerate(samples):
        row = list(s) + ([junk] * (length - len(s)) if s and s[-1] == EOS else [])
        rows[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return rows


@settings(max_examples=60)
@given(case=_case(), junk=TOKENS)
def test_token_lists_give_the_batch_of_hf_generate_output(case, junk):
    prompts, samples, n, length, pad_to = case
    got = layout.batch_from_samples(prompts, samples, n, pad_id=PAD, eos_id=EOS, response_length=length,
                                    prompt_pad_to=pad_to)
    ids, mask = layout.left_pad(prompts, PAD, pad_to)
    hf = layout.assemble(ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0),
                         _hf_generate_rows(samples, length, junk), PAD, EOS)
    assert got.keys() == hf.keys()
    assert all(torch.equal(got[k], hf[k]) for k in got)

    width = ids.shape[1]
    for row, s in enumerate(samples):
        p = prompts[row // n]
        assert got["input_ids"][row, width - len(p):width].tolist() == p
        assert got["response_mask"][row].tolist() == [1] * len(s) + [0] * (length - len(s))
        assert got["responses"][row, : len(s)].tolist() == s
        assert set(got["responses"][row, len(s):].tolist()) <= {PAD}
    real = got["attention_mask"].bool()
    assert torch.equal(got["position_ids"][real], torch.cat([torch.arange(k) for k in real.sum(1).tolist()]))


def test_a_sample_cut_short_without_eos_masks_only_its_tokens():
    # vLLM stops a request at max_model_len without an EOS; HF generate never returns such a row.
    b = layout.batch_from_samples([[5]], [[3, 4]], 1, pad_id=PAD, eos_id=EOS, response_length=4, prompt_pad_to=None)
    assert b["response_mask"].tolist() == [[1, 1, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]


def test_a_sample_longer_than_the_response_length_is_an_error():
    with pytest.raises(ValueError, match="response_length=2"):
        layout.batch_from_samples([[5]], [[3, 4, 5]], 1, pad_id=PAD, eos_id=EOS, response_length=2,
                                  prompt_pad_to=None)


def test_sample_count_must_be_prompts_times_n():
    with pytest.raises(ValueError, match="n=2"):
        layout.batch_from_samples([[5], [6]], [[3]] * 3, 2, pad_id=PAD, eos_id=EOS, response_length=2,
                                  prompt_pad_to=None)


def test_the_engines_log_probs_land_under_their_tokens_and_nowhere_else():
    # Sample 0 ends at EOS (its log-prob counts: the EOS is a sampled token); sample 1 is cut short.
    b = layout.batch_from_samples([[5]], [[3, EOS], [4]], 2, pad_id=PAD, eos_id=EOS, response_length=3,
                                  prompt_pad_to=None, sample_log_probs=[[-0.5, -0.25], [-2.0]])
    assert b["rollout_log_probs"].tolist() == [[-0.5, -0.25, 0.0], [-2.0, 0.0, 0.0]]
    assert b["rollout_log_probs"].dtype == torch.float32


def test_a_log_prob_list_that_does_not_match_its_tokens_is_an_error():
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        layout.batch_from_samples([[5]], [[3, 4]], 1, pad_id=PAD, eos_id=EOS, response_length=2,
                                  prompt_pad_to=None, sample_log_probs=[[-1.0]])
