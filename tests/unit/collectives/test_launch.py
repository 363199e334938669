"""The launcher's target (``SCRIPT [ARGS]`` or ``-m MODULE [ARGS]``), its rank command, and ``run -m``."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from repro.collectives.cli import build_parser, main
from repro.collectives.launch import launcher
from repro.collectives.launch.launcher import Target, rank_command
from repro.collectives.record.session import stop
from tests.subprocess_env import pythonpath

SCENARIO = "repro.scenarios.zero2_inactive_micro"


def test_dash_m_target_becomes_a_rank_command_that_run_parses_back_to_the_module():
    target = Target.parse(["-m", SCENARIO, "--skip-inactive", "-m", "x"])
    assert target == Target(SCENARIO, ("--skip-inactive", "-m", "x"), module=True)
    target.check()
    cmd = rank_command(target)
    assert cmd == [
        sys.executable,
        "-m",
        "repro.collectives_trace",
        "run",
        "-m",
        SCENARIO,
        "--skip-inactive",
        "-m",
        "x",
    ]
    args = build_parser().parse_args(cmd[3:])
    assert (args.cmd, args.module, args.script) == ("run", [SCENARIO, "--skip-inactive", "-m", "x"], None)


def test_script_target_keeps_the_script_command_line(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    target = Target.parse([str(script), "--steps", "2"])
    target.check()
    cmd = rank_command(target)
    assert cmd[4:] == [str(script), "--steps", "2"]
    args = build_parser().parse_args(cmd[3:])
    assert (args.module, args.script, args.args) == (None, str(script), ["--steps", "2"])


@pytest.mark.parametrize(
    ("tokens", "message"),
    [([], "SCRIPT [ARGS] or -m MODULE [ARGS]"), (["-m"], "'-m' needs a MODULE")],
)
def test_a_missing_target_is_a_value_error_naming_both_forms(tokens, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Target.parse(tokens)


@pytest.mark.parametrize(
    "name", ["no_such_module_q7", "repro.no_such_module_q7", "no_such_pkg_q7.mod", ".rel"]
)
def test_an_unimportable_module_is_refused_before_any_rank_starts(tmp_path, capsys, name):
    out = tmp_path / "trace"
    assert main(["launch", "--nproc-per-node", "2", "--out", str(out), "--", "-m", name]) == 2
    assert f"MODULE {name!r} (-m) is not importable" in capsys.readouterr().err
    assert not out.exists()


def test_run_dash_m_runs_the_module_as_main_with_its_arguments(tmp_path, monkeypatch, request):
    (tmp_path / "argv_probe_q7.py").write_text(
        textwrap.dedent("""
        import json, sys
        if __name__ == "__main__":
            with open(sys.argv[1], "w") as f:
                json.dump({"argv": sys.argv}, f)
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("REPRO_COLLECTIVES_TRACE", str(tmp_path / "trace"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    record = tmp_path / "argv.json"
    request.addfinalizer(stop)  # run started tracing in this process
    assert main(["run", "-m", "argv_probe_q7", str(record), "--flag", "-m", "x"]) == 0
    argv = json.loads(record.read_text())["argv"]
    assert argv == [str(tmp_path / "argv_probe_q7.py"), str(record), "--flag", "-m", "x"]


def test_run_without_a_script_or_module_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run"])
    assert exc.value.code == 2
    assert "SCRIPT [ARGS] or -m MODULE [ARGS]" in capsys.readouterr().err


def test_launch_refuses_an_out_path_that_is_a_file_in_one_line(tmp_path, capsys):
    script = tmp_path / "job.py"
    script.write_text("pass\n")
    out = tmp_path / "taken"
    out.write_text("not a directory")
    assert main(["launch", "--nproc-per-node", "2", "--out", str(out), "--", str(script)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {str(out)!r} is an existing file" in err


@pytest.mark.parametrize(
    ("env", "target", "message"),
    [
        (None, ["job.py"], "REPRO_COLLECTIVES_TRACE, which is not set"),
        ("trace", ["no_such_script_q14.py"], "SCRIPT 'no_such_script_q14.py' is not a file"),
        ("trace", ["-m", "no_such_module_q14"], "MODULE 'no_such_module_q14' (-m) is not importable"),
    ],
)
def test_run_refuses_a_missing_trace_dir_or_target_in_one_line(
    tmp_path, monkeypatch, capsys, env, target, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.py").write_text("raise SystemExit('must not run')\n")
    if env is None:
        monkeypatch.delenv("REPRO_COLLECTIVES_TRACE", raising=False)
    else:
        monkeypatch.setenv("REPRO_COLLECTIVES_TRACE", env)
    assert main(["run", *target]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err



def test_the_launcher_analyze_and_export_do_not_import_torch():
    # A launch is a launcher process plus its ranks; only the ranks need torch. Importing it in
    # the launcher too cost ~3 CPU s per launch on a 2-core machine (about 30 launches a suite).
    probe = ("import sys, repro.collectives_trace; from repro.collectives.cli import build_parser; "
             "from repro.collectives.launch import launcher; build_parser(); "
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    root = pathlib.Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=root,
                         env=dict(os.environ, PYTHONPATH=pythonpath(root)))
    assert out.stdout.strip() == "[]", out.stdout[:2000]


def test_a_flight_recorder_dump_answers_the_symbolizer_without_importing_inductor(monkeypatch):
    # torch's C++ symbolizer looks up torch._inductor.codecache.PyCodeCache.stack_frames_for_code at
    # each dump; in a process that never imported inductor the real one answers None for every frame
    # (nothing compiled, PyCodeCache.linemaps empty), so the stand-in must too, and go away after.
    import types

    from repro.collectives.launch.stall import _no_inductor_import

    fake_torch = types.SimpleNamespace()
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    with _no_inductor_import(fake_torch):
        assert fake_torch._inductor.codecache.PyCodeCache.stack_frames_for_code("/x.py", 3) is None
    assert not hasattr(fake_torch, "_inductor")
    # A process with inductor imported (a compiled program) keeps the real one.
    monkeypatch.setitem(sys.modules, "torch._inductor", types.ModuleType("torch._inductor"))
    with _no_inductor_import(fake_torch):
        assert not hasattr(fake_torch, "_inductor")


def test_free_port_draws_below_the_ephemeral_range_and_skips_a_port_someone_holds(monkeypatch):
    # Outgoing connections take their local port from the ephemeral range; a rendezvous port drawn
    # there can be taken between the draw and rank 0's bind (CI lost rank 0 to EADDRINUSE so).
    low = launcher._ephemeral_low()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, launcher._PORT_FLOOR + 7])
        monkeypatch.setattr(launcher.random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        assert launcher.free_port() == launcher._PORT_FLOOR + 7
    monkeypatch.undo()
    for _ in range(20):
        assert launcher._PORT_FLOOR <= launcher.free_port() < low


def test_a_rank_that_has_not_issued_its_first_call_gets_the_start_grace_not_the_stall_window(tmp_path, monkeypatch):
    # CI under load: rank 1 waited in its first collective while rank 0 was still importing torch,
    # and a 3 s stall window called that a hang.
    import json

    from repro.collectives.launch import stall

    call = {"ev": "call", "rank": 1, "index": 0, "op": "all_reduce", "group": "0", "ranks": [0, 1],
            "group_seq": 1, "numel": 4, "dtype": "float32", "site": "job.py:3 <module>", "t": 0.0}
    (tmp_path / "rank1.jsonl").write_text(json.dumps({"ev": "meta", "rank": 1}) + "\n" + json.dumps(call) + "\n")
    now = [1000.0]
    monkeypatch.setattr(stall.time, "monotonic", lambda: now[0])
    watch = stall.ProgressWatch(tmp_path, stall_s=3.0)
    now[0] += 0.1
    watch.stalled([0, 1])  # first poll sees rank 1's record
    now[0] += 10.0  # past stall_s, within the grace: rank 0 may still be starting
    assert not watch.stalled([0, 1])
    now[0] += 1.0  # the watch polls at most every 0.5 s
    assert watch.stalled([0, 1], finished=True)  # a rank has exited: nobody is starting any more
    now[0] += stall.START_GRACE_S
    assert watch.stalled([0, 1])  # past the grace: a hang
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"ev": "meta", "rank": 0}) + "\n")
    watch = stall.ProgressWatch(tmp_path, stall_s=3.0)
    now[0] += 0.1
    watch.stalled([0, 1])
    now[0] += 10.0  # both have records: the stall window applies as before
    assert watch.stalled([0, 1])
