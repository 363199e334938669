"""The reward half of the pre-start checks: a reward exists for every row and the plug-in works.

Without this a parquet with an unknown ``data_source``, or a reward file with a typo, fails only
when the first batch is scored, 30-90 s in, as a traceback. Here: one line, before Ray starts. Errors are ``ValueError``;
``repro.run.preflight.check_rewards`` turns them into its ``InputError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from repro.config import RunConfig, custom_reward


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, (str, Path)) else [str(v) for v in value]


def _sources_and_sample(cfg: RunConfig) -> tuple[list[tuple[str, str]], dict[str, Any] | None]:
    """((key, data_source) per distinct source of the data files, a first row as a reward sample)."""
    import pyarrow.parquet as pq

    d = cfg.data
    found: list[tuple[str, str]] = []
    sample = None
    for key, value in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        for f in _files(value):
            if not Path(f).is_file():
                continue  # reported by the data-file check
            try:
                names = pq.ParquetFile(f).schema_arrow.names
                cols = [c for c in (d.reward_fn_key, "reward_model", "extra_info") if c in names]
                rows = pq.read_table(f, columns=cols).to_pylist() if d.reward_fn_key in cols else []
            except Exception:  # noqa: BLE001 - an unreadable file is the data-file check's to report
                continue
            for src in dict.fromkeys(str(r[d.reward_fn_key]) for r in rows):
                found.append((key, src))
            if sample is None and rows:
                r = rows[0]
                gt = (r.get("reward_model") or {}).get("ground_truth", "")
                sample = {"data_source": str(r[d.reward_fn_key]), "ground_truth": str(gt),
                          "extra_info": r.get("extra_info")}
    return found, sample


def check_rewards(cfg: RunConfig) -> None:
    """The plug-in (if set) loads and returns a number on a sample; else every source has a rule reward."""
    from repro.rewards import known_sources
    from repro.rewards.custom import check_score, load_custom_reward, verl_extra_info

    plugin = custom_reward(cfg)
    sources, sample = _sources_and_sample(cfg)
    if plugin is None:
        known = known_sources()
        for key, src in sources:
            if src not in known:
                raise ValueError(
                    f"{key}: data_source {src!r} (column {cfg.data.reward_fn_key}) has no reward; sources with "
                    f"one: {known}; or set reward.custom_reward_function.path to your compute_score file"
                )
        return
    key, section = plugin
    fn = load_custom_reward(key, section.path, section.name, section.reward_kwargs)
    if sample is None:  # the built-in arithmetic task
        sample = {"data_source": "repro/arith", "ground_truth": "4", "extra_info": {"split": "train", "index": 0}}
    # A well-formed answer, so a function that only scores the happy path is exercised too.
    sample["solution_str"] = f"The answer is #### {sample['ground_truth']}"
    sample["extra_info"] = verl_extra_info(sample.get("extra_info"))
    check_score(key, fn, sample)
