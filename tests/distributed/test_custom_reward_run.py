"""verl's reward plug-in through the real trainer: a 2-step tiny GRPO job scored by a user's file.

The file has verl's signature and returns a constant that the rule reward never gives (0.25 for
every response), so the run's score rows show that the plug-in, not the GSM8K rule, was used.
"""

from __future__ import annotations

import pytest

from tests import jobs

REWARD = '''
def my_score(data_source, solution_str, ground_truth, extra_info=None, value=0.0):
    assert isinstance(solution_str, str) and data_source == "repro/arith"
    return value
'''


@pytest.mark.slow  # one real job: about a minute on 2 loaded cores
def test_custom_reward_function_scores_a_real_run(tmp_path, ray_head):
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    out = tmp_path / "run"
    key = "reward.custom_reward_function"
    command = [*jobs.SMALL, "trainer.total_training_steps=2", "trainer.test_freq=-1", "trainer.val_before_train=False",
               "trainer.save_freq=-1", f"{key}.path={reward}", f"{key}.name=my_score", f"+{key}.reward_kwargs.value=0.25",
               f"trainer.output_dir={out}"]
    jobs.run_job("grpo_tiny", command, tmp_path / "outputs", ray_address=ray_head)
    rows = jobs.metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["critic/score/mean"] == 0.25 for r in rows), [r["critic/score/mean"] for r in rows]
