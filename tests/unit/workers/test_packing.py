"""The remove-padding packer: no real token lost or duplicated, rows within their capacity,
samples contiguous with their own positions, and the scatter back to the padded layout exact."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.batching.token_budget import first_fit
from repro.workers import varlen
from repro.workers.packing import pack


@settings(max_examples=50, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), max_size=20), capacity=st.one_of(st.none(), st.integers(1, 60)))
def test_first_fit_places_every_sample_once_within_capacity(lengths, capacity):
    rows = first_fit(lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    if capacity is None:
        assert len(rows) <= 1
    else:
        for row in rows:
            assert sum(lengths[i] for i in row) <= capacity or len(row) == 1
        # first fit: a sample opens a new row only when it fits in none of the earlier ones
        for r, row in enumerate(rows):
            first = row[0]
            for earlier in rows[:r]:
                used = sum(lengths[i] for i in earlier if i < first)
                assert used + lengths[first] > capacity


@st.composite
def padded_batches(draw):
    """verl's layout: left-padded prompts, right-padded responses, positions counting real tokens."""
    b, p, r = draw(st.integers(1, 6)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(1, p + 1, (b,), generator=gen)
    r_lens = torch.randint(0, r + 1, (b,), generator=gen)
    mask = torch.cat([torch.arange(p)[None] >= (p - p_lens)[:, None], torch.arange(r)[None] < r_lens[:, None]], 1)
    ids = torch.randint(1, 1000, (b, p + r), generator=gen) * mask
    pos = (mask.long().cumsum(1) - 1).clamp(min=0)
    capacity = draw(st.one_of(st.none(), st.integers(1, p + r + 4)))
    return ids, mask.long(), pos, capacity, p


@settings(max_examples=50, deadline=None)
@given(batch=padded_batches())
def test_pack_keeps_every_real_token_once_and_scatters_back(batch):
    ids, mask, pos, capacity, _ = batch
    packed = pack(ids, mask, pos, capacity)
    seq = ids.shape[1]
    # every real token exactly once, at a distinct packed slot
    assert sorted(packed.padded_index.tolist()) == mask.reshape(-1).nonzero().squeeze(-1).tolist()
    assert len(set(packed.packed_index.tolist())) == packed.packed_index.numel()
    assert torch.equal(packed.input_ids.reshape(-1)[packed.packed_index], ids.reshape(-1)[packed.padded_index])
    assert torch.equal(packed.position_ids.reshape(-1)[packed.packed_index], pos.reshape(-1)[packed.padded_index])
    # rows within min(capacity, S), unless one sample alone is longer
    cap = seq if capacity is None else min(capacity, seq)
    assert packed.input_ids.shape[1] <= max(cap, int(mask.sum(1).max()), 1)
    # scatter back: a per-token function of the packed ids lands on the same padded token, 0 elsewhere
    back = packed.unpack(packed.input_ids.float() * 2)
    assert torch.equal(back, ids.float() * 2 * mask)
    # next_token of a sample's non-final token is the sample's next real token
    nxt = packed.next_token.reshape(-1)
    for i in range(ids.shape[0]):
        real = mask[i].nonzero().squeeze(-1)
        for a, b in zip(real[:-1].tolist(), real[1:].tolist(), strict=True):
            k = (packed.padded_index == i * seq + a).nonzero().item()
            assert nxt[packed.packed_index[k]] == ids[i, b]


@settings(max_examples=50, deadline=None)
@given(batch=padded_batches(), one_row=st.booleans())
def test_response_slots_hold_the_positions_that_predict_each_response_token(batch, one_row):
    ids, mask, pos, capacity, prompt = batch
    response_mask = mask[:, prompt:]
    packed = pack(ids, mask, pos, capacity, one_row=one_row)
    if one_row:
        assert packed.input_ids.shape[0] == 1
    slots = packed.response_slots(response_mask)
    # the packed next token at each slot is the response token it predicts, 0 off the mask
    labels = packed.next_token[:, slots.columns]
    assert torch.equal(slots.scatter(labels.float()), (ids[:, prompt:] * response_mask).float())
    # one row asks for no column it does not need
    if one_row:
        assert slots.columns.numel() == int(response_mask.sum())


def _reference_layout(ids, mask, pos, capacity, one_row):
    """The layout written out sample by sample: first-fit rows in batch order, each sample's real
    tokens back to back in its row (the loop the vectorised ``pack`` replaced)."""
    batch, seq = mask.shape
    lengths = mask.sum(1).tolist()
    rows = first_fit(lengths, None if one_row else seq if capacity is None else min(capacity, seq))
    width = max([sum(lengths[i] for i in row) for row in rows] + [1])
    out_ids, out_pos = torch.zeros(len(rows), width, dtype=ids.dtype), torch.zeros(len(rows), width, dtype=pos.dtype)
    packed, padded = [], []
    for r, row in enumerate(rows):
        col = 0
        for i in row:
            for j in range(seq):
                if mask[i, j]:
                    out_ids[r, col], out_pos[r, col] = ids[i, j], pos[i, j]
                    packed.append(r * width + col)
                    padded.append(i * seq + j)
                    col += 1
    return out_ids, out_pos, packed, padded


@settings(max_examples=50, deadline=None)
@given(batch=padded_batches(), one_row=st.booleans(), holes=st.booleans())
def test_pack_writes_the_first_fit_layout_sample_by_sample(batch, one_row, holes):
    # the exact layout, not only its properties: the CPU goldens and the padded-vs-packed parity
    # depend on which slot each token takes. `holes`: masks with gaps inside a sample too.
    ids, mask, pos, capacity, _ = batch
    if holes:
        mask = mask * (torch.arange(mask.shape[1]) % 3 != 1)
    packed = pack(ids, mask, pos, capacity, one_row=one_row)
    ref_ids, ref_pos, ref_packed, ref_padded = _reference_layout(ids, mask, pos, capacity, one_row)
    assert torch.equal(packed.input_ids, ref_ids) and torch.equal(packed.position_ids, ref_pos)
    assert packed.packed_index.tolist() == ref_packed and packed.padded_index.tolist() == ref_padded


@settings(max_examples=50, deadline=None)
@given(batch=padded_batches(), one_row=st.booleans())
def test_the_host_positions_and_boundaries_are_the_packed_rows_own(batch, one_row):
    # The workers compute the varlen boundaries on the host (no device wait inside the micro-batch loop); they must
    # be what the model's pre-hook computes from the packed rows' positions on the device, value and dtype. Both run
    # varlen.cu_seqlens (proven on its own in tests/unit/workers/test_varlen.py): what is checked here is that the
    # host's positions are the packed rows' and that the keyword arguments passed are the hook's.
    ids, mask, pos, capacity, _ = batch
    packed = pack(ids, mask, pos, capacity, one_row=one_row)
    host = packed.host_positions(pos)
    assert torch.equal(host, packed.position_ids) and host.dtype == packed.position_ids.dtype
    given_kwargs = varlen.host_boundaries(host, packed.input_ids.device)
    _, hooked = varlen.with_boundaries(None, (), {"position_ids": packed.position_ids})
    assert given_kwargs.keys() == set(varlen.BOUNDARY_KWARGS)
    for key in varlen.BOUNDARY_KWARGS:
        a, b = given_kwargs[key], hooked[key]
        assert (torch.equal(a, b) and a.dtype == b.dtype) if torch.is_tensor(a) else (type(a) is int and a == b), key
