"""The worker benchmark refuses an SP layout it cannot run before any rank starts."""

from __future__ import annotations

import pytest

from repro.bench import workers


@pytest.mark.parametrize("argv, part", [
    (["--sp", "2", "--runners", "worker,bare"], "--runners worker"),
    (["--sp", "3", "--nproc", "2", "--runners", "worker"], "divide --nproc=2"),
    (["--sp", "0", "--runners", "worker"], "--sp=0"),
])
def test_sp_the_bench_cannot_run_is_one_line_and_exit_2(argv, part, capsys, tmp_path):
    assert workers.main([*argv, "--workdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --sp=") and part in err and "\n" not in err
    assert not any(tmp_path.iterdir())  # refused before the model folder is written


def test_the_narrow_shape_keeps_what_sets_the_0p6b_host_op_count():
    # --host-ops on a CPU stands in for the 0.6B's count: depth, norms, GQA ratio and vocabulary equal
    from repro.bench.workers import _model_config

    full, narrow = _model_config("qwen3-0.6b"), _model_config("qwen3-0.6b-narrow")
    keep = ("num_hidden_layers", "vocab_size", "tie_word_embeddings", "rms_norm_eps", "max_position_embeddings")
    assert {k: getattr(narrow, k) for k in keep} == {k: getattr(full, k) for k in keep}
    assert (narrow.num_attention_heads // narrow.num_key_value_heads
            == full.num_attention_heads // full.num_key_value_heads)
    assert narrow.hidden_size < full.hidden_size
