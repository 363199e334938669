"""A user's reward function runs unchanged in both trainers: verl 0.9.1's reward manager and repro's.

One file with verl's signature ``compute_score(data_source, solution_str, ground_truth, extra_info,
**reward_kwargs)``, configured the same way in both (``reward.custom_reward_function.path`` / ``.name``
/ ``.reward_kwargs``), is loaded by verl's own ``load_reward_manager`` from verl's own trainer config
and run by its ``naive`` manager on a DataProto, and loaded by repro's config and scored as repro's
trainer scores a batch (``score_responses`` with the rows' ``extra_info``). The function reads its
keyword argument and ``extra_info`` (the row's ``index`` and verl's ``num_turns``), so a trainer that
passed neither, or another ``extra_info``, gives another score or an error here.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.trainer.ppo.reward import load_reward_manager

from repro.config import custom_reward
from repro.config.loader import load_config
from repro.data.tokenizer import build_tokenizer
from repro.rewards import reward_lookup
from repro.rl.step import score_responses

REWARD = '''
def my_score(data_source, solution_str, ground_truth, extra_info, bonus=0.0):
    assert extra_info["num_turns"] is None  # what a single-turn rollout reports in verl
    right = solution_str.strip().endswith("#### " + ground_truth)
    return float(right) + bonus + 0.01 * extra_info["index"] + (0.5 if data_source == "my/task" else 0.0)
'''
# (response text, data_source, ground truth, row index)
SAMPLES = [("so #### 7", "my/task", "7", 3), ("so 8", "my/task", "7", 0), ("#### 12", "other", "12", 41),
           ("", "other", "1", 7)]


def _verl_scores(path: pathlib.Path, tok) -> list[float]:
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[
            f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=my_score",
            "+reward.custom_reward_function.reward_kwargs.bonus=0.25"])
    manager = load_reward_manager(cfg, tok)
    out = []
    for text, source, truth, index in SAMPLES:
        ids = tok(text, add_special_tokens=False)["input_ids"] or [tok.pad_token_id]
        width = len(ids) + 2  # padded past the response, as a rollout batch is
        responses = torch.tensor([ids + [tok.pad_token_id] * 2])
        mask = torch.tensor([[1] * len(ids) + [0] * 2]) if text else torch.zeros(1, width, dtype=torch.long)
        data = DataProto.from_dict(
            tensors={"responses": responses, "attention_mask": mask},
            non_tensors={"data_source": np.array([source], dtype=object),
                         "reward_model": np.array([{"ground_truth": truth}], dtype=object),
                         "extra_info": np.array([{"index": index}], dtype=object)})
        out.append(manager.loop.run_until_complete(manager.run_single(data))["reward_score"])
    return out


def _repro_scores(path: pathlib.Path, tmp_path: pathlib.Path) -> list[float]:
    cfg = load_config([f"reward.custom_reward_function.path={path}", "reward.custom_reward_function.name=my_score",
                       "reward.custom_reward_function.reward_kwargs.bonus=0.25", "trainer.device=cpu",
                       f"trainer.output_dir={tmp_path / 'out'}"], config_name="grpo_tiny")
    texts, sources, truths, indices = zip(*SAMPLES, strict=True)
    scores = score_responses(texts, sources, truths, reward_lookup(custom_reward(cfg)), cfg.reward.reward_kwargs,
                             [{"index": i} for i in indices])
    return scores.tolist()


def test_the_same_reward_file_scores_the_same_in_verls_reward_manager_and_in_repros_trainer(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD)
    tok = build_tokenizer()
    theirs, ours = _verl_scores(path, tok), _repro_scores(path, tmp_path)
    # float32 in repro's score tensor, float64 in verl's: the same number rounded once.
    assert ours == pytest.approx(theirs, rel=0, abs=1e-6), (ours, theirs)
    assert theirs == pytest.approx([1.25 + 0.03 + 0.5, 0.25 + 0.5, 1.25 + 0.41, 0.25 + 0.07])
