"""Prompts for the trainer: parquet rows -> prompt text -> prompt token ids, batch by batch.

``render_prompt`` applies the tokenizer's chat template (the plain template of the character
tokenizer, Qwen's template for a real Qwen3 folder) or joins the message contents when there is
none. ``PromptDataset`` reads verl-schema parquet files, drops (``filter_overlong_prompts``),
truncates or rejects prompts longer than ``max_prompt_length`` tokens, and hands out batches in an
order fixed by the seed and the epoch, with a position that a checkpoint can save and restore.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import pyarrow.parquet as pq


def render_prompt(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """The prompt string the policy sees for a row's chat messages."""
    messages = [dict(m) for m in messages]
    if not messages:
        raise ValueError("prompt has no messages")
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "".join(m["content"] for m in messages)


class PromptItem(TypedDict):
    """One prompt, ready for rollout (a dict, so callers can pass it around as plain data)."""

    index: int
    """Position in the dataset before filtering (row number across the files, in order)."""
    input_ids: list[int]
    """Prompt token ids (no padding)."""
    text: str
    """Rendered prompt."""
    data_source: str
    """Value of the ``reward_fn_key`` column: selects the reward function."""
    ground_truth: str
    """Passed to the reward function."""
    extra_info: dict[str, Any]
    """The row's ``extra_info`` (split, index, ...)."""


TRUNCATIONS = ("error", "left", "right", "middle")


def _truncate(ids: list[int], limit: int, how: str) -> list[int]:
    if how == "left":
        return ids[-limit:]
    if how == "right":
        return ids[:limit]
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head):]


class PromptDataset:
    """Tokenised prompts of one parquet file with deterministic, resumable batching.

    Each epoch visits the rows in a permutation fixed by ``(seed, epoch)`` (or in file order with
    ``shuffle=False``); a last partial batch is dropped, as verl's train loader does.
    """

    def __init__(self, files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], tokenizer: Any,
                 max_prompt_length: int, filter_overlong_prompts: bool = False, truncation: str = "error",
                 shuffle: bool = True, seed: int = 0, prompt_key: str = "prompt",
                 reward_fn_key: str = "data_source") -> None:
        paths = [Path(files)] if isinstance(files, (str, os.PathLike)) else [Path(f) for f in files]
        if not paths:
            raise ValueError("data files: empty list; give one or more parquet files")
        for path in paths:
            if not path.is_file():
                raise ValueError(f"data file {path} does not exist")
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length={max_prompt_length} must be >= 1")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation={truncation!r} is not one of {list(TRUNCATIONS)}")
        self.paths, self.seed, self.shuffle = paths, seed, shuffle
        self.items: list[PromptItem] = []
        self.num_dropped = 0
        index = 0
        for path in paths:
            rows = pq.read_table(path).to_pylist()
            for key in (prompt_key, reward_fn_key, "reward_model"):
                if rows and key not in rows[0]:
                    raise ValueError(f"{path}: no column {key!r}; columns: {sorted(rows[0])}")
            for i, row in enumerate(rows):
                text = render_prompt(tokenizer, row[prompt_key])
                ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
                index += 1
                if len(ids) > max_prompt_length:
                    if filter_overlong_prompts:
                        self.num_dropped += 1
                        continue
                    if truncation == "error":
                        raise ValueError(
                            f"{path} row {i}: prompt has {len(ids)} tokens > max_prompt_length="
                            f"{max_prompt_length}; raise data.max_prompt_length, set "
                            "data.filter_overlong_prompts=True or choose data.truncation=left/right/middle"
                        )
                    ids = _truncate(ids, max_prompt_length, truncation)
                self.items.append(PromptItem(
                    index=index - 1, input_ids=ids, text=text, data_source=row[reward_fn_key],
                    ground_truth=str(row["reward_model"]["ground_truth"]),
                    extra_info=row.get("extra_info") or {},
                ))
        if not self.items:
            raise ValueError(
                f"{[str(p) for p in paths]}: no prompts left ({index} rows, {self.num_dropped} longer than "
                f"max_prompt_length={max_prompt_length})"
            )
        self.epoch = 0
        self.position = 0

    @classmethod
    def from_config(cls, files: Any, tokenizer: Any, data_cfg: Any, shuffle: bool | None = None) -> PromptDataset:
        """Build from verl-named ``data.*`` settings (``repro.config.DataConfig``)."""
        return cls(files, tokenizer, max_prompt_length=data_cfg.max_prompt_length,
                   filter_overlong_prompts=data_cfg.filter_overlong_prompts, truncation=data_cfg.truncation,
                   shuffle=data_cfg.shuffle if shuffle is None else shuffle, seed=data_cfg.seed,
                   prompt_key=data_cfg.prompt_key, reward_fn_key=data_cfg.reward_fn_key)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> PromptItem:
        return self.items[i]

    def order(self, epoch: int) -> list[int]:
        """Item order of an epoch."""
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(f"repro.prompts:{self.seed}:{epoch}").shuffle(order)
        return order

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full batches per epoch."""
        return len(self.items) // batch_size

    def next_batch(self, batch_size: int) -> list[PromptItem]:
        """The next ``batch_size`` prompts, moving to the next epoch when this one runs short."""
        if not 1 <= batch_size <= len(self.items):
            raise ValueError(
                f"batch size {batch_size} must be between 1 and the {len(self.items)} prompts of {self.paths}"
            )
        if self.position + batch_size > len(self.items):
            self.epoch += 1
            self.position = 0
        order = self.order(self.epoch)
        batch = [self.items[j] for j in order[self.position : self.position + batch_size]]
        self.position += batch_size
        return batch

    def state_dict(self) -> dict[str, int]:
        """Where batching stands; restore with ``load_state_dict`` to continue the same sequence."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_items": len(self.items)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume batching from ``state_dict()`` of a dataset built from the same file and settings."""
        for key, mine in (("seed", self.seed), ("num_items", len(self.items))):
            if state.get(key) != mine:
                raise ValueError(
                    f"cannot resume prompt data of {self.paths}: checkpoint has {key}={state.get(key)}, "
                    f"this dataset has {key}={mine}"
                )
        if not 0 <= state["position"] <= len(self.items) or state["epoch"] < 0:
            raise ValueError(f"cannot resume prompt data of {self.paths}: bad position in {state}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
