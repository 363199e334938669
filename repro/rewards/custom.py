"""verl's reward plug-in (``custom_reward_function.path`` / ``.name``), loaded the way verl 0.9 loads it.

verl's ``get_custom_reward_fn`` imports the file as a module and wraps the named function so that
``custom_reward_function.reward_kwargs`` are passed on every call; the function is called as
``fn(data_source, solution_str, ground_truth, extra_info)``. The same file therefore runs unchanged
in both trainers. Errors are ``ValueError`` with one line naming the config key, so the pre-start
check can turn them into an exit-2 line instead of a worker traceback a minute later.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

CustomFn = Callable[..., float]


def load_custom_reward(key: str, path: str, name: str, reward_kwargs: Mapping[str, Any]) -> CustomFn:
    """The function ``name`` of the file ``path`` with ``reward_kwargs`` bound (``key`` names the section)."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{key}.path={path!r} does not exist (give the Python file defining {name})")
    spec = importlib.util.spec_from_file_location(f"custom_module_{file.stem}", file)
    if spec is None or spec.loader is None:
        raise ValueError(f"{key}.path={path!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        # Registered like verl does, so pickling (Ray) and dataclasses inside the file work.
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any import-time error is the user's file, reported in one line
        raise ValueError(f"{key}.path={path!r} fails to import: {type(e).__name__}: {e}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"{key}.name={name!r} is not a function in {path}; its functions: {found}")
    kwargs = dict(reward_kwargs)

    def wrapped(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
        return fn(data_source, solution_str, ground_truth, extra_info, **kwargs)

    wrapped.__name__ = name
    return wrapped


def verl_extra_info(extra_info: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``extra_info`` verl 0.9's naive reward manager passes for a single-turn rollout: the row's own,
    plus ``num_turns`` (None) and ``rollout_reward_scores`` ({}), so a function that reads it runs the same."""
    return {**(extra_info or {}), "num_turns": None, "rollout_reward_scores": {}}


def check_score(key: str, fn: CustomFn, sample: Mapping[str, Any]) -> float:
    """Call ``fn`` once on ``sample`` (data_source, solution_str, ground_truth, extra_info); a float or ``ValueError``."""
    try:
        out = fn(sample["data_source"], sample["solution_str"], sample["ground_truth"], sample.get("extra_info"))
    except Exception as e:  # noqa: BLE001 - whatever the user's function raises is reported in one line
        raise ValueError(f"{key}: {fn.__name__} raised {type(e).__name__}: {e} on a sample of "
                         f"data_source={sample['data_source']!r}") from None
    # verl also accepts a dict with a "score" entry (extra metrics next to it).
    score = out.get("score") if isinstance(out, dict) else out
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(float(score)):
        raise ValueError(f"{key}: {fn.__name__} returned {out!r} ({type(out).__name__}) on a sample; "
                         "it must return a finite number (or a dict with a 'score' number)")
    return float(score)


def as_float(out: Any) -> float:
    """The score of one call: a number, or a dict's ``score`` entry (verl's richer return)."""
    return float(out["score"] if isinstance(out, dict) else out)
