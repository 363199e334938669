"""TEMPORARY stand-in for repro.data.prompts.PromptDataset until the data helper's lands."""

from __future__ import annotations

from typing import Any

from repro.data.parquet_io import read_rows


class PromptDataset:
    def __init__(self, files: Any, tokenizer: Any, data_cfg: Any) -> None:
        files = [files] if isinstance(files, str) else list(files)
        self.items = []
        for f in files:
            for row in read_rows(f):
                text = tokenizer.apply_chat_template(row[data_cfg.prompt_key], tokenize=False, add_generation_prompt=True)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if len(ids) > data_cfg.max_prompt_length:
                    raise ValueError(f"prompt of {len(ids)} tokens > data.max_prompt_length")
                self.items.append({"input_ids": ids, "data_source": row[data_cfg.reward_fn_key],
                                   "ground_truth": row["reward_model"]["ground_truth"]})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]
