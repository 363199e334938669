"""repro.rl.step.batch_metrics against verl 0.9.1's metric_utils.compute_data_metrics.

Every key verl reports for a batch must be reported by repro with the same value: aborted
(empty) responses left out of the score, reward and non-aborted length statistics, and NaN
where there is nothing to average, exactly as verl does.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_data_metrics

from repro.rl.step import batch_metrics, token_level_scores
from tests.verl_parity.inputs import close


@st.composite
def rollouts(draw):
    rows = draw(st.integers(1, 6))
    prompt_width, width = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    prompt_lens = draw(st.lists(st.integers(1, prompt_width), min_size=rows, max_size=rows))
    resp_lens = draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    # Prompts left-padded, responses right-padded: verl's layout.
    prompt_mask = (torch.arange(prompt_width).flip(0).unsqueeze(0) < torch.tensor(prompt_lens).unsqueeze(1)).long()
    resp_mask = (torch.arange(width).unsqueeze(0) < torch.tensor(resp_lens).unsqueeze(1)).long()
    scores = torch.tensor(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0]), min_size=rows, max_size=rows)))
    level = token_level_scores(scores, resp_mask.float())
    return {
        "input_ids": torch.randint(0, 50, (rows, prompt_width + width), generator=gen),
        "responses": torch.randint(0, 50, (rows, width), generator=gen),
        "attention_mask": torch.cat([prompt_mask, resp_mask], dim=1),
        "response_mask": resp_mask.float(),
        "token_level_scores": level,
        "token_level_rewards": level - 0.01 * torch.rand(rows, width, generator=gen) * resp_mask,
        "advantages": torch.randn(rows, width, generator=gen) * resp_mask,
        "returns": torch.randn(rows, width, generator=gen) * resp_mask,
        "values": torch.randn(rows, width, generator=gen) * resp_mask,
    }, scores


@given(rollout=rollouts(), use_critic=st.booleans())
def test_data_metrics_equal_verls_key_for_key(rollout, use_critic):
    batch, scores = rollout
    ours = batch_metrics(batch, scores, use_critic)
    width = batch["responses"].shape[1]
    verl_batch = {**batch, "prompts": batch["input_ids"][:, :-width]}
    theirs = compute_data_metrics(DataProto.from_dict(verl_batch), use_critic=use_critic)
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"verl reports metrics repro does not: {missing}"
    # Means, maxima and minima over the batch's tokens or rows, summed in another order than verl's
    # (torch.mean against sum / count): every token and row once, at the largest value or length.
    rows, width = batch["responses"].shape
    terms = rows * width + rows + 4
    magnitude = max([float(t.abs().max()) for t in batch.values() if t.is_floating_point()]
                    + [float(batch["attention_mask"].sum(-1).max())])
    for key, value in theirs.items():
        close(ours[key], value, terms, magnitude)


@given(rollout=rollouts(), seconds=st.lists(st.floats(0.0, 10.0), min_size=6, max_size=6), drop=st.integers(0, 5))
def test_timing_per_token_equals_verls(rollout, seconds, drop):
    from verl.trainer.ppo.metric_utils import compute_timing_metrics

    from repro.rl.step import timing_per_token_ms

    batch, _ = rollout
    names = ["gen", "ref", "values", "adv", "update_critic", "update_actor"]
    raw = {name: s for i, (name, s) in enumerate(zip(names, seconds, strict=True)) if i != drop}
    ours = timing_per_token_ms(batch, {f"timing_s/{k}": v for k, v in raw.items()})
    theirs = {k: v for k, v in compute_timing_metrics(DataProto.from_dict(batch), raw).items()
              if k.startswith("timing_per_token_ms/")}
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        close(ours[key], value)


@given(rollout=rollouts(), seconds=st.floats(1e-3, 100.0), n_gpus=st.integers(1, 16))
def test_throughput_equals_verls(rollout, seconds, n_gpus):
    from verl.trainer.ppo.metric_utils import compute_throughout_metrics

    from repro.rl.metrics import throughput_metrics

    batch, _ = rollout
    data = DataProto.from_dict(batch, meta_info={"global_token_num": batch["attention_mask"].sum(-1).tolist()})
    theirs = compute_throughout_metrics(data, {"step": seconds}, n_gpus)
    ours = throughput_metrics(batch["attention_mask"], seconds, n_gpus)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        close(ours[key], value)
