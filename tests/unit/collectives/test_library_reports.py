"""Reports on collectives a library issued: the rank-local setting named, stacks outermost first, a rank's own error first."""

from __future__ import annotations

from repro.collectives.analyze.align import Divergence, parted
from repro.collectives.analyze.report import cause, format_divergence
from repro.collectives.events import RankTrace
from repro.collectives.launch.launcher import exception_line, own_exception, raised_report
from tests.unit.collectives.helpers import call

_DDP = "DDP reducer: {what} (find_unused_parameters={fu}, static_graph=False, bucket_cap_mb=25; DDP built at train.py:12 <module>)"


def _mismatch(a, b) -> Divergence:
    return Divergence("mismatch", "0", (0, 1), 0, 1, a, b, differing=a.differing_fields(b))


def test_ddp_settings_that_differ_between_ranks_are_named_as_the_cause():
    a = call(0, 5, op="broadcast", numel=5, dtype="int32")
    b = call(1, 5, numel=4, dtype="int32")
    a.issuer = _DDP.format(what="gradient bucket", fu=False)
    b.issuer = _DDP.format(what="unused-parameter bitmap", fu=True)
    text = format_divergence(_mismatch(a, b))
    assert "Cause: the ranks built DistributedDataParallel with different settings" in text
    assert "find_unused_parameters=False on rank 0, find_unused_parameters=True on rank 1" in text
    assert "rank 1's call was issued from C++ by: DDP reducer: unused-parameter bitmap" in text


def test_equal_ddp_settings_give_no_cause_and_python_calls_none_either():
    a, b = call(0, 5), call(1, 5, numel=8)
    assert cause(_mismatch(a, b)) is None
    a.issuer = b.issuer = _DDP.format(what="gradient bucket", fu=False)
    assert cause(_mismatch(a, b)) is None


def test_the_whole_user_stack_is_printed_outermost_first_with_the_loop_line():
    a, b = call(0, 3), call(1, 3, numel=8)
    a.stack = ["model.py:40 forward", "train.py:20 train_step", "train.py:55 <module>"]
    text = format_divergence(_mismatch(a, b))
    block = text.split("rank 0's user stack (outermost first, the call last):\n", 1)[1].splitlines()[:3]
    assert [line.strip() for line in block] == ["train.py:55 <module>", "train.py:20 train_step", "model.py:40 forward"]


def test_where_the_paths_parted_is_the_first_same_call_from_different_stacks():
    a = [call(0, 1), call(0, 2), call(0, 3)]
    b = [call(1, 1), call(1, 2), call(1, 3, op="barrier", numel=0, dtype="")]
    a[1].stack, b[1].stack = ["train.py:9 probe", "train.py:30 <module>"], ["train.py:5 step", "train.py:28 <module>"]
    traces = {0: RankTrace(0, calls=a), 1: RankTrace(1, calls=b)}
    div = _mismatch(a[2], b[2])
    div.parted = parted(traces, div)
    assert div.parted["seq"] == 2
    assert "rank 0: train.py:30 <module> > train.py:9 probe" in format_divergence(div)


def test_a_ranks_own_traceback_is_found_and_a_mismatch_report_is_not_taken_for_one(tmp_path):
    (tmp_path / "rank1.log").write_text(
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "/r/repro/collectives_trace.py", line 45, in <module>\n'
        "[rank1]:     sys.exit(main())\n"
        '[rank1]:   File "/r/repro/collectives/cli.py", line 190, in _cmd_run\n'
        '[rank1]:     runpy.run_path(target.name, run_name="__main__")\n'
        '[rank1]:   File "<frozen runpy>", line 88, in _run_code\n'
        '[rank1]:   File "job.py", line 4, in <module>\n'
        "[rank1]:     load()\n"
        "[rank1]: ValueError: batch 1 has no rows\n"
        "Current thread 0x00007f (most recent call first):\n"
        '  File "x.py", line 1 in y\n'
    )
    (tmp_path / "rank0.log").write_text(
        "Traceback (most recent call last):\n"
        '  File "job.py", line 6, in <module>\n'
        "repro.collectives.check.checker.CollectiveMismatchError: Collective mismatch on group 0\n"
    )
    tb = own_exception(tmp_path, 1)
    assert tb is not None and "frozen runpy" not in tb and "Current thread" not in tb
    assert "collectives_trace.py" not in tb and "cli.py" not in tb and "runpy.run_path" not in tb
    assert 'File "job.py", line 4' in tb
    assert exception_line(tb) == "ValueError: batch 1 has no rows"
    assert own_exception(tmp_path, 0) is None


def _extra_forward_divergence(rank0_back_in_step: bool) -> Divergence:
    """Rank 0 ran a probe (an extra forward/backward) whose collectives equal the next step's."""
    step, probe = ["train.py:10 train_step", "train.py:28 <module>"], ["train.py:17 gradient_probe", "train.py:30 <module>"]
    a = call(0, 19, op="all_gather_single", numel=72)
    b = call(1, 19, op="barrier", numel=0, dtype="")
    a.stack = step if rank0_back_in_step else ["train.py:16 finish", "train.py:31 <module>"]
    b.stack = ["train.py:16 finish", "train.py:31 <module>"]
    div = _mismatch(a, b)
    div.parted = {"seq": 13, "call": "all_gather_single numel=72 float32", "stacks": {"0": probe, "1": step}}
    return div


def test_an_extra_pass_through_a_helper_is_named_as_the_cause_with_the_line_that_called_it():
    text = format_divergence(_extra_forward_divergence(rank0_back_in_step=True))
    assert (
        "Cause: rank 0 ran an extra pass that rank 1 did not: the call at train.py:30 <module> (into gradient_probe)"
        in text.splitlines()[1]
    )
    assert "from call #13 on group 0" in text


def test_an_extra_pass_is_not_blamed_on_a_rank_when_neither_issues_from_the_others_parted_path():
    reason = cause(_extra_forward_divergence(rank0_back_in_step=False))
    assert reason is not None and reason.startswith("the ranks ran different code that issues the same collectives")
    assert "rank 0 ran an extra pass" not in reason
    plain = _extra_forward_divergence(rank0_back_in_step=True)
    plain.parted = None
    assert cause(plain) is None


_OWN = (
    "Traceback (most recent call last):\n"
    '  File "/x/raises.py", line 10, in load_batch\n'
    "ValueError: batch 1 on rank 1 has no rows"
)
_PEER_DIED = (
    "Traceback (most recent call last):\n"
    '  File "/x/raises.py", line 17, in <module>\n'
    '  File "/venv/site-packages/torch/distributed/distributed_c10d.py", line 3252, in all_reduce\n'
    "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:28833."
)


def test_the_rank_that_raised_by_itself_leads_and_a_peer_that_then_failed_in_a_collective_follows():
    text = raised_report({0: _PEER_DIED, 1: _OWN})
    assert text.startswith("rank 1 raised ValueError: batch 1 on rank 1 has no rows\n")
    assert "rank 0 raised RuntimeError: [gloo" in text
    assert "(inside a collective, after rank 1 raised: a consequence of it)" in text
    both_own = raised_report({0: _OWN.replace("rank 1", "rank 0"), 1: _OWN})
    assert both_own.startswith("rank 0 raised") and "consequence" not in both_own
