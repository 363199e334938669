"""A rank's shard -> mini-batches -> micro-batches on one process (no peers: the counts are local)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.batching.batch import padded_batch
from repro.workers.mini_batches import mean_update_stats, plan_mini_batches


def _shard(samples: int, resp_lens: list[int], width: int = 5) -> dict[str, torch.Tensor]:
    prompt_mask = torch.ones(samples, 2, dtype=torch.long)
    response_mask = (torch.arange(width)[None] < torch.tensor(resp_lens)[:, None]).long()
    out = padded_batch(torch.ones(samples, 2, dtype=torch.long), prompt_mask, response_mask * 7, response_mask)
    out["row"] = torch.arange(samples)
    return out


@given(data=st.data(), minis=st.integers(1, 4), per_rank_mini=st.integers(1, 6), epochs=st.integers(1, 3),
       shuffle=st.booleans(), dynamic=st.booleans())
def test_every_sample_is_in_one_micro_batch_per_epoch_and_counts_match_the_masks(
        data, minis, per_rank_mini, epochs, shuffle, dynamic):
    samples = minis * per_rank_mini
    lens = data.draw(st.lists(st.integers(0, 5), min_size=samples, max_size=samples))
    micro = data.draw(st.sampled_from([d for d in range(1, per_rank_mini + 1) if per_rank_mini % d == 0]))
    budget = data.draw(st.integers(7, 20)) if dynamic else None
    out = plan_mini_batches(_shard(samples, lens), per_rank_mini, epochs, shuffle=shuffle, seed=3,
                            micro=None if dynamic else micro, max_token_len=budget)
    assert len(out) == minis * epochs
    for e in range(epochs):
        rows = [int(r) for m in out[e * minis:(e + 1) * minis] for mb in m.micro_batches for r in mb["row"]]
        assert sorted(rows) == list(range(samples))
    for m in out:
        rows = [int(r) for mb in m.micro_batches for r in mb["row"]]
        assert m.global_tokens == m.local_tokens == sum(lens[r] for r in rows)
        assert m.global_seqs == max(sum(lens[r] > 0 for r in rows), 1)
        if dynamic:
            assert all(int(mb["attention_mask"].sum(-1).max()) <= budget for mb in m.micro_batches)
        else:
            assert [mb["row"].numel() for mb in m.micro_batches] == [micro] * (per_rank_mini // micro)


def test_a_shard_that_is_not_whole_mini_batches_is_refused():
    with pytest.raises(ValueError, match="not a multiple of its mini-batch"):
        plan_mini_batches(_shard(5, [1] * 5), 2, 1, shuffle=False, seed=0, micro=1, max_token_len=None)


def test_update_stats_sum_micro_batches_divide_per_token_keys_and_average_updates():
    per_update = [[{"loss": 1.0, "frac": 2.0}, {"loss": 3.0, "frac": torch.tensor(4.0)}], [{"loss": 5.0}]]
    out = mean_update_stats(per_update, [3.0, 0.0], ("frac",))
    assert out == {"loss": pytest.approx((4.0 + 5.0) / 2), "frac": pytest.approx(6.0 / 3.0)}
