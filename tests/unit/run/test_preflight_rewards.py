"""verl's reward plug-in and the data sources' rewards are checked before Ray: exit 2, one line naming the key.

Each case is a real command line through ``main()``: a reward file that is missing, lacks the
function, raises, or returns a non-number; a data_source without a reward. The good plug-in
scores with verl's signature, under the new and the legacy key.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from repro.config import custom_reward
from repro.config.loader import load_config
from repro.data.parquet_io import write_rows
from repro.main_ppo import main
from repro.rewards import reward_lookup
from repro.run.preflight import preflight

GOOD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str.strip().endswith(ground_truth)) + bonus
'''
FILES = {
    "good.py": GOOD,
    "raises.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    raise KeyError('answer')\n",
    "text.py": "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 'right'\n",
    "broken.py": "def compute_score(:\n",
}


def _rows(source: str, n: int = 40) -> list[dict]:
    return [{"data_source": source, "prompt": [{"role": "user", "content": f"{i}+1="}], "ability": "math",
             "reward_model": {"ground_truth": str(i + 1), "style": "rule"}, "extra_info": {"index": i}}
            for i in range(n)]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    write_rows(_rows("repro/arith"), tmp_path / "arith.parquet")
    write_rows(_rows("my/task"), tmp_path / "mine.parquet")
    return tmp_path


def _argv(tmp: Path, *extra: str, data: str = "arith.parquet") -> list[str]:
    return ["-cn", "grpo_tiny", "trainer.device=cpu", f"trainer.output_dir={tmp / 'out'}",
            f"data.train_files={tmp / data}", f"data.val_files={tmp / data}", *extra]


KEY = "reward.custom_reward_function"
CASES = [
    ("missing file", [f"{KEY}.path=nope.py"], f"{KEY}.path"),
    ("missing function", [f"{KEY}.path=good.py", f"{KEY}.name=score"], f"{KEY}.name='score'"),
    ("function raises", [f"{KEY}.path=raises.py"], "raised KeyError"),
    ("returns text", [f"{KEY}.path=text.py"], "finite number"),
    ("file does not import", [f"{KEY}.path=broken.py"], "SyntaxError"),
    ("legacy key, missing file", ["custom_reward_function.path=nope.py"], "custom_reward_function.path"),
]


@pytest.mark.parametrize("name,extra,expect", CASES, ids=[c[0] for c in CASES])
def test_bad_reward_plugin_exits_2_with_one_line_naming_the_key(name, extra, expect, inputs, capsys):
    extra = [e.replace("path=", f"path={inputs}/") for e in extra]
    assert main(_argv(inputs, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err


def test_data_source_without_reward_names_the_sources_that_have_one(inputs, capsys):
    assert main(_argv(inputs, data="mine.parquet")) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'my/task'" in line and "repro/arith" in line and "openai/gsm8k" in line and "custom_reward_function" in line


@pytest.mark.parametrize("key", [KEY, "custom_reward_function"])
def test_good_plugin_passes_and_scores_any_source_with_verls_signature(key, inputs):
    cfg = load_config([f"{key}.path={inputs / 'good.py'}", f"{key}.reward_kwargs.bonus=0.5",
                       f"data.train_files={inputs / 'mine.parquet'}", f"data.val_files={inputs / 'mine.parquet'}",
                       f"trainer.output_dir={inputs / 'out'}", "trainer.device=cpu"], config_name="grpo_tiny")
    assert preflight(cfg) == []
    fn = reward_lookup(custom_reward(cfg))("my/task")
    assert fn("so #### 7", "7") == 1.5 and fn("so 8", "7") == 0.5


def test_new_and_legacy_keys_that_disagree_are_refused(inputs, capsys):
    argv = _argv(inputs, f"{KEY}.path={inputs / 'good.py'}", f"custom_reward_function.path={inputs / 'text.py'}")
    assert main(argv) == 2
    assert "set only one" in capsys.readouterr().err


def test_an_empty_path_or_a_bad_name_is_a_config_error():
    with pytest.raises(ValueError, match="name"):
        load_config([f"{KEY}.name=not a name"], config_name="grpo_tiny")
