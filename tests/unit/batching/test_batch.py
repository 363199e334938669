"""The batch type's row operations: shards, joins, selections, chunks and the padded layout."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from repro.batching.batch import (
    HOST_COPIED,
    chunks,
    concat_batches,
    host_key,
    host_view,
    num_samples,
    pad_responses,
    padded_batch,
    pick,
    select,
    seq_lens,
    shard_batch,
    split_list,
    to_device,
    trimmed,
    with_host_copies,
)


def _batch(rows: int) -> dict[str, torch.Tensor]:
    return {"responses": torch.arange(rows * 3).reshape(rows, 3), "advantages": torch.arange(rows, dtype=torch.float32)}


@given(parts=st.integers(1, 6), per_part=st.integers(0, 5))
def test_shards_are_contiguous_equal_and_concat_restores_the_batch(parts, per_part):
    batch = _batch(parts * per_part)
    shards = shard_batch(batch, parts)
    assert [num_samples(s) for s in shards] == [per_part] * parts
    assert [s["advantages"].tolist() for s in shards] == [
        list(map(float, range(r * per_part, (r + 1) * per_part))) for r in range(parts)
    ]
    back = concat_batches(shards)
    assert all(torch.equal(back[k], batch[k]) for k in batch)


def test_uneven_batch_split_is_refused():
    with pytest.raises(ValueError, match="evenly"):
        shard_batch({"a": torch.zeros(5, 2)}, 2)


def test_concat_of_shards_with_different_keys_is_refused():
    with pytest.raises(ValueError, match="different keys"):
        concat_batches([{"a": torch.zeros(1)}, {"b": torch.zeros(1)}])


def test_split_list_keeps_order_and_spreads_the_remainder():
    assert split_list(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
    assert split_list([1], 2) == [[1], []]


@given(total=st.integers(0, 40), size=st.integers(1, 12))
def test_chunks_cover_every_index_once_in_order_with_only_the_last_short(total, size):
    out = chunks(total, size)
    assert [i for c in out for i in c] == list(range(total))
    assert all(len(c) == size for c in out[:-1])
    assert not out or 1 <= len(out[-1]) <= size


def test_chunk_size_below_one_is_refused():
    with pytest.raises(ValueError, match="positive"):
        chunks(4, 0)


@given(rows=st.integers(1, 8), data=st.data())
def test_select_takes_the_rows_in_the_given_order_and_drops_scalars(rows, data):
    index = data.draw(st.lists(st.integers(0, rows - 1), max_size=10))
    batch = {**_batch(rows), "step": torch.tensor(3)}
    out = select(batch, index)
    assert set(out) == {"responses", "advantages"}
    assert out["advantages"].tolist() == [float(i) for i in index]
    assert torch.equal(out["responses"], batch["responses"][index])


def test_pick_keeps_the_named_keys_that_exist():
    batch = _batch(2)
    assert set(pick(batch, ("advantages", "returns"))) == {"advantages"}


def test_to_device_moves_tensors_and_keeps_other_values():
    out = to_device({"a": torch.zeros(2), "n": 3}, torch.device("meta"))
    assert out["a"].device.type == "meta" and out["n"] == 3


@given(prompt_lens=st.lists(st.integers(0, 5), min_size=1, max_size=6), data=st.data())
def test_padded_batch_positions_count_real_tokens_and_masks_join(prompt_lens, data):
    b, p, r = len(prompt_lens), 5, 4
    resp_lens = data.draw(st.lists(st.integers(0, r), min_size=b, max_size=b))
    prompt_mask = (torch.arange(p)[None] >= (p - torch.tensor(prompt_lens))[:, None]).long()
    response_mask = (torch.arange(r)[None] < torch.tensor(resp_lens)[:, None]).long()
    prompts, responses = torch.randint(1, 9, (b, p)) * prompt_mask, torch.randint(1, 9, (b, r)) * response_mask
    out = padded_batch(prompts, prompt_mask, responses, response_mask)
    assert seq_lens(out) == [pl + rl for pl, rl in zip(prompt_lens, resp_lens, strict=True)]
    assert torch.equal(out["input_ids"][:, p:], responses) and torch.equal(out["responses"], responses)
    for row in range(b):
        real = out["attention_mask"][row].bool()
        assert out["position_ids"][row][real].tolist() == list(range(int(real.sum())))
        assert out["position_ids"][row][: p - prompt_lens[row]].eq(0).all()


def _batch_aliases(source: str) -> list[str]:
    """Module-level names bound to ``dict[str, torch.Tensor]`` (or named ``Batch``) in ``source``."""
    import ast

    out = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and value is not None and (
                target.id == "Batch" or ast.unparse(value).replace(" ", "") == "dict[str,torch.Tensor]"
            ):
                out.append(target.id)
    return out


def test_the_batch_type_is_defined_in_one_module_only():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[3] / "repro"
    found = {str(p.relative_to(root)): names for p in sorted(root.rglob("*.py"))
             if (names := _batch_aliases(p.read_text()))}
    assert found == {"batching/batch.py": ["Batch"]}, f"define batch types in repro/batching/batch.py only, not in {found}"


def test_the_alias_scanner_finds_a_second_definition():
    assert _batch_aliases("import torch\nRows = dict[str, torch.Tensor]\nBatch = dict\n") == ["Rows", "Batch"]
    assert _batch_aliases("from repro.batching.batch import Batch\nx: int = 1\n") == []


def _ragged(b: int, p: int, r: int, p_lens: list[int], r_lens: list[int]) -> dict[str, torch.Tensor]:
    prompt_mask = (torch.arange(p)[None] >= (p - torch.tensor(p_lens))[:, None]).long()
    response_mask = (torch.arange(r)[None] < torch.tensor(r_lens)[:, None]).long()
    ids = torch.arange(1, b * (p + r) + 1).reshape(b, p + r)
    return padded_batch(ids[:, :p] * prompt_mask, prompt_mask, ids[:, p:] * response_mask, response_mask)


@given(st.integers(1, 6).flatmap(lambda b: st.tuples(
    st.lists(st.integers(0, 7), min_size=b, max_size=b), st.lists(st.integers(0, 9), min_size=b, max_size=b))))
def test_trimming_drops_only_columns_that_are_padding_in_every_row(lens):
    p_lens, r_lens = lens
    mb = _ragged(len(p_lens), 7, 9, p_lens, r_lens)
    t = trimmed(mb)
    # Every real token is kept, with its position; only all-padding columns went.
    assert t["attention_mask"].sum() == mb["attention_mask"].sum()
    assert t["input_ids"][t["attention_mask"] == 1].tolist() == mb["input_ids"][mb["attention_mask"] == 1].tolist()
    assert t["position_ids"][t["attention_mask"] == 1].tolist() == mb["position_ids"][mb["attention_mask"] == 1].tolist()
    assert t["input_ids"].shape[1] == max(p_lens) + max(max(r_lens), 1)
    assert torch.equal(pad_responses(t["response_mask"], 9), mb["response_mask"])


def test_a_trimmed_forward_gives_every_response_token_the_full_width_log_prob():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from repro.workers.logprob import token_log_probs
    from tests.error_model import decoder_chain, float_tol

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, initializer_range=0.2, attn_implementation="sdpa")
    model = Qwen3ForCausalLM(cfg).double()
    p, r = 16, 12  # the rollout's widths; the rows below are shorter on both sides
    mb = _ragged(4, p, r, [5, 7, 3, 6], [4, 2, 0, 5])
    mb["input_ids"] = mb["input_ids"] % 128
    mb["responses"] = mb["responses"] % 128

    def log_probs(b):
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"],
                       logits_to_keep=b["responses"].shape[1] + 1).logits[:, :-1]
        return token_log_probs(logits, b["responses"])[0] * b["response_mask"]

    full, t = log_probs(mb), trimmed(mb)
    assert t["input_ids"].shape[1] == 7 + 5  # the longest prompt and the longest response
    got = pad_responses(log_probs(t), r)
    # fp64, the same tokens and positions; only the all-masked key columns are gone from each softmax and
    # attention sum (exact zeros): the error model's bound along the model's chain.
    tol = float_tol(decoder_chain(cfg, p + r), full.detach().abs().max(), torch.float64)
    assert (got - full).abs().max().item() <= tol


def test_select_copies_the_index_to_a_device_once_not_once_per_key():
    # On a GPU each host-to-device copy of the index waits for the device; "meta" stands in for it here
    # (a real device for the dispatcher: every copy to it is an aten::_to_copy).
    from torch.utils._python_dispatch import TorchDispatchMode

    class CopiesToMeta(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and str(kwargs.get("device")) == "meta":
                CopiesToMeta.n += 1
            return func(*args, **kwargs)

    batch = {k: torch.zeros(6, 4, device="meta") for k in ("input_ids", "attention_mask", "position_ids",
                                                            "responses", "response_mask", "old_log_probs")}
    batch["host_side"] = torch.arange(6)
    with CopiesToMeta():
        out = select(batch, [5, 0, 3])
    assert CopiesToMeta.n == 1
    assert out["input_ids"].shape == (3, 4) and out["host_side"].tolist() == [5, 0, 3]


def test_rank_batches_carry_host_copies_that_every_row_operation_keeps_on_the_host():
    from repro.batching.batch import (
        select,
        seq_lens,
        to_device,
    )

    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(5, 7, generator=gen) > 0.3).long()
    batch = {"input_ids": torch.randint(1, 9, (5, 7), generator=gen), "attention_mask": mask,
             "position_ids": mask.cumsum(1), "response_mask": mask[:, 4:], "responses": mask[:, 4:] * 3}
    carried = with_host_copies(batch)
    assert {host_key(k) for k in HOST_COPIED} <= set(carried)
    rows = select(carried, [4, 1])
    for k in HOST_COPIED:
        assert torch.equal(rows[host_key(k)], batch[k][[4, 1]]) and rows[host_key(k)].device.type == "cpu"
        assert host_view(rows, k) is rows[host_key(k)]  # the copy itself, no second copy
    assert seq_lens(rows) == mask[[4, 1]].sum(1).tolist()
    # to_device moves the batch, never its host copies (on this machine both stay put; the test is the key rule)
    moved = to_device(carried, torch.device("meta"))
    assert moved["attention_mask"].device.type == "meta" and moved[host_key("attention_mask")].device.type == "cpu"
    # where the batch carries none, host_view copies the tensor itself
    assert torch.equal(host_view(batch, "attention_mask"), mask)
