"""verl-parity behaviour of the GSM8K rule reward and the reward registry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repro.rewards import get_reward_fn, known_sources
from repro.rewards.gsm8k import CLIP_CHARS, compute_score, extract_solution
from tests.strategies import digit_free_text, gsm8k_numbers, response_prefix

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "gsm8k"


def _records(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


@pytest.mark.parametrize("split", ["train.jsonl", "test.jsonl"])
@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_real_gsm8k_answers_score_full_marks_against_their_own_ground_truth(split, method):
    records = _records(split)
    assert len(records) == 64
    for rec in records:
        truth = rec["answer"].split("#### ")[-1].replace(",", "")
        assert compute_score(rec["answer"], truth, method=method) == 1.0, rec["answer"][-80:]


def test_real_answer_scored_against_another_problems_truth_gets_format_score():
    a, b = _records("test.jsonl")[:2]
    truth_b = b["answer"].split("#### ")[-1]
    assert truth_b not in a["answer"].split("#### ")[-1]
    assert compute_score(a["answer"], truth_b, format_score=0.1) == 0.1


@given(prefix=response_prefix(), number=gsm8k_numbers())
def test_any_prefix_then_final_answer_scores_full(prefix, number):
    response = prefix + "\n#### " + number
    assert compute_score(response, number, method="strict", score=1.0) == 1.0
    assert compute_score(response, number, method="strict", score=2.5, format_score=0.3) == 2.5


@given(prefix=response_prefix(), number=gsm8k_numbers(), other=gsm8k_numbers())
def test_wrong_final_answer_scores_format_score(prefix, number, other):
    if other == number:
        other = number + "1"
    assert compute_score(prefix + "#### " + other, number, format_score=0.1) == 0.1


@given(text=digit_free_text())
def test_no_answer_scores_zero_even_with_a_format_score(text):
    for method in ("strict", "flexible"):
        assert compute_score(text, "42", method=method, format_score=0.5) == 0


@given(thousands=st.integers(1, 999), rest=st.integers(0, 999), filler=digit_free_text(max_size=50))
def test_strict_strips_commas_and_flexible_keeps_them(thousands, rest, filler):
    with_commas = f"{thousands},{rest:03d}"
    truth = f"{thousands}{rest:03d}"
    response = filler + "#### " + with_commas
    assert extract_solution(response, "strict") == truth
    assert compute_score(response, truth, method="strict") == 1.0
    # verl's flexible extraction returns the number as written.
    assert compute_score(response, truth, method="flexible", format_score=0.1) == 0.1


def test_dollar_sign_after_hashes_is_not_a_strict_answer_but_flexible_finds_the_number():
    assert extract_solution("#### $18", "strict") is None
    assert compute_score("so #### $18", "18") == 0
    assert compute_score("so #### $18", "18", method="flexible") == 1.0


def test_strict_takes_the_last_marked_answer():
    assert compute_score("#### 5 then I changed my mind #### 7", "7") == 1.0
    assert compute_score("#### 7 then I changed my mind #### 5", "7", format_score=0.1) == 0.1


def test_flexible_takes_the_last_number_as_written():
    assert compute_score("3 apples and 4 pears make 7", "7", method="flexible") == 1.0
    assert extract_solution("the answer is 18.", "flexible") == "18."
    assert extract_solution("1 . 2 .", "flexible") == "2"
    assert compute_score("the answer is 18.", "18", method="flexible") == 0.0


@given(number=gsm8k_numbers(), pad=st.integers(0, 2 * CLIP_CHARS))
def test_only_the_last_300_characters_are_scored(number, pad):
    answer = "#### " + number
    response = answer + "x" * pad
    expected = 1.0 if len(answer) + pad <= CLIP_CHARS else 0
    assert compute_score(response, number) == expected


def test_an_answer_before_the_300_character_window_is_ignored_in_favour_of_one_inside():
    response = "#### 1" + "y" * CLIP_CHARS + "#### 2"
    assert compute_score(response, "2") == 1.0
    assert compute_score("#### 1" + "y" * CLIP_CHARS, "1") == 0


def test_unknown_method_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match="strict"):
        compute_score("#### 1", "1", method="lenient")


def test_registry_maps_gsm8k_and_arith_to_the_gsm8k_rule():
    assert get_reward_fn("openai/gsm8k") is compute_score
    assert get_reward_fn("repro/arith") is compute_score
    assert known_sources() == ["openai/gsm8k", "repro/arith"]


def test_registry_rejects_an_unknown_source_listing_the_known_ones():
    with pytest.raises(ValueError, match=r"lighteval/MATH.*openai/gsm8k.*repro/arith"):
        get_reward_fn("lighteval/MATH")
