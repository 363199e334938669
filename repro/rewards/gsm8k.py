"""GSM8K rule reward with the behaviour of verl's ``verl.utils.reward_score.gsm8k``.

Written here from the documented behaviour, not copied:

- only the last 300 characters of the response are looked at (the final answer sits at the
  end, and regexes over very long generations are slow);
- ``strict``: the last ``#### <number>`` (exactly one space after the hashes); ``,`` and ``$``
  are removed from the captured number. A ``$`` right after ``#### `` therefore does not match
  at all, as in verl;
- ``flexible``: the last run of digits / ``.`` / ``,`` (optionally signed) that is not just
  ``.``; nothing is stripped from it, as in verl, so ``1,000`` does not equal ``1000``;
- no answer found -> ``0``; an answer that differs from the ground truth -> ``format_score``;
  the right answer -> ``score``.
"""

from __future__ import annotations

import re

CLIP_CHARS = 300
METHODS = ("strict", "flexible")

_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"(-?[0-9.,]+)")
# Runs that the number pattern matches but that carry no digit of their own.
_NOT_A_NUMBER = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the answer string the given method finds in the response, or ``None``."""
    if method not in METHODS:
        raise ValueError(f"gsm8k reward: method={method!r} is not one of {list(METHODS)}")
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")
    found = _NUMBER.findall(tail)
    if not found:
        return None
    # verl keeps the last candidate it looked at even when every candidate was invalid.
    answer = found[-1]
    for answer in reversed(found):
        if answer not in _NOT_A_NUMBER:
            break
    return answer


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score one response against the ground-truth number string (verl's GSM8K rule)."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
