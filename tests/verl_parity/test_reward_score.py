"""repro.rewards.gsm8k against verl 0.9.1's reward_score.gsm8k: the same score, exactly.

Responses are built from the pieces the two regexes care about (``#### ``, signs, digits, ``.``,
``,``, ``$``, words and newlines) and made long enough, sometimes, to cross the 300-character clip.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from verl.utils.reward_score import gsm8k as verl_gsm8k

from repro.rewards import gsm8k

_PIECES = st.sampled_from(["#### ", "####", "#", " ", "-", "$", ".", ",", "1", "7", "42", "1,000", "3.5",
                           "answer", "\n", "The answer is "])


@given(pieces=st.lists(_PIECES, max_size=30), padding=st.integers(0, 400),
       truth=st.sampled_from(["42", "7", "1000", "1,000", "-1", "3.5", "0"]),
       method=st.sampled_from(list(gsm8k.METHODS)), format_score=st.sampled_from([0.0, 0.1]))
def test_gsm8k_score_and_extraction(pieces, padding, truth, method, format_score):
    text = "x" * padding + "".join(pieces)
    assert gsm8k.extract_solution(text, method) == verl_gsm8k.extract_solution(text, method)
    ours = gsm8k.compute_score(text, truth, method, format_score, 1.0)
    theirs = verl_gsm8k.compute_score(text, truth, method, format_score, 1.0)
    assert ours == theirs and type(ours) is type(theirs)
