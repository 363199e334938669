"""``python -m repro.bench six-case|crossover|workers|peers|rmpad|rollout ...``: every benchmark.

- ``six-case``: the six ZeRO cases (ZeRO-1/2/3 with and without CPU offload), one real training
  run each; writes ``outputs/<run_tag>_<timestamp>/summary.tsv``, ``<case>/train.log`` and
  ``curves.png``.
- ``crossover``: the ZeRO-1/2 seed gate: ZeRO-1 and ZeRO-2 per seed and per
  ``VERL_DS_ZERO2_STEP_EACH_MICRO`` mode; writes ``summary.tsv``, ``compare.tsv`` (per seed: ZeRO-2
  minus ZeRO-1, and step-each-micro 1 minus 0), ``overall.tsv`` (mean and spread over seeds, and
  whether each difference exceeds the seed-to-seed noise) and ``curves.png``.
- ``workers``, ``peers``, ``rmpad``, ``rollout``: :mod:`repro.bench.workers` (the update throughput
  table), :mod:`repro.bench.peers` (repro beside verl and TRL on one GPU), :mod:`repro.bench.rmpad`
  (padded, token-budget and remove-padding updates), :mod:`repro.bench.rollout` (rollout speed),
  each with its own arguments.

``--collect DIR [DIR ...]`` runs nothing: it reads the ``summary.tsv`` of earlier outputs of the same
benchmark (e.g. one seed per device command, or per pair of GPUs) and writes the summaries, comparisons
and curves of them all into a new output folder, as if one command had run them.

The base command line comes after ``--`` (default ``-cn grpo_tiny``), e.g.
``python -m repro.bench six-case --steps 60 -- -cn ppo_tiny trainer.n_gpus_per_node=2``.
A progress line is printed per case; the exit status is 1 when a case still failed after its
retries (its row says so), 2 for bad arguments or a base the config loader refuses.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from repro.bench.rl_cases import (
    DEFAULT_BASE,
    SIX_CASES,
    Case,
    crossover_cases,
    crossover_comparisons,
    run_case,
    validate_base,
)
from repro.bench.summary import (
    COMPARE_COLUMNS,
    OVERALL_COLUMNS,
    SUMMARY_COLUMNS,
    overall_rows,
    paired_deltas,
    parse_summary_row,
    read_tsv,
    write_tsv,
)

# Benchmarks with a module of their own: `python -m repro.bench <name> ...` is `python -m repro.bench.<name> ...`.
FORWARDED = {
    "workers": "the worker update benchmark",
    "peers": "one GPU: repro's GRPO step beside verl's and TRL's",
    "rmpad": "the actor update: padded, token budgets, remove-padding, LoRA",
    "rollout": "rollout speed: hf, plain generate, vLLM",
}


def _fmt(value: Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, float) else "-"


def _progress(i: int, total: int, row: dict[str, Any]) -> str:
    return (f"[{i}/{total}] {row['case']} seed {row['seed']}: {row['status']} (retries {row['retries']}) "
            f"{_fmt(row['wall_s'], '.1f')} s, score {_fmt(row['first_score'])} -> {_fmt(row['last_score'])} "
            f"tail5 {_fmt(row['avg_score_tail5'])}, throughput tail5 {_fmt(row['avg_throughput_tail5'], '.1f')}, "
            f"peak {_fmt(row['max_memory_reserved_gb'], '.2f')} GB, optimizer {row['optimizer_on'] or '-'}, "
            f"params {row['params_on'] or '-'}")


def _plot(out: Path, runs: list[tuple[str, Path]]) -> str:
    """``curves.png``: score and throughput per step, one line per case (and seed)."""
    try:
        import matplotlib
    except ImportError:
        return "no curves.png: matplotlib is not installed"
    from repro.rl.metrics import SCORE, THROUGHPUT, MetricsLog

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, metrics in runs:
        if not metrics.is_file():
            continue
        rows = MetricsLog(metrics).rows
        for ax, key in zip(axes, (SCORE, THROUGHPUT), strict=True):
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), float)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, lw=1)
    for ax, title in zip(axes, ("train score (mean)", "throughput (tokens/s per rank)"), strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(out.name)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=90)
    plt.close(fig)
    return f"curves: {out / 'curves.png'}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro.bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, tag, help_ in (("six-case", "ds_zero_six_case", "the six ZeRO cases"),
                             ("crossover", "ds_zero12_seed_gate", "the ZeRO-1/2 seed gate")):
        s = sub.add_parser(name, help=help_)
        if name == "six-case":
            s.add_argument("--seed", type=int, default=7777)
            s.add_argument("--cases", default=",".join(c.name for c in SIX_CASES),
                           help="comma-separated subset of the six cases")
        else:
            s.add_argument("--seeds", default="7777", help="seeds separated by spaces or commas")
            s.add_argument("--step-modes", default="0,1", help="VERL_DS_ZERO2_STEP_EACH_MICRO values: 0, 1 or 0,1")
            s.add_argument("--cases", default="", help="comma-separated subset of the step modes' cases "
                                                       "(zero1_sem0, zero2_sem0, ...; default all)")
        s.add_argument("--collect", nargs="+", type=Path, metavar="DIR",
                       help="run nothing: summarise these earlier outputs of this benchmark together")
        s.add_argument("--steps", type=int, default=60, help="RL steps per run")
        s.add_argument("--run-tag", default=tag, help="outputs/<run-tag>_<timestamp>/")
        s.add_argument("--outputs-root", default="outputs")
        s.add_argument("--retries", type=int, default=1, help="retries of a failed run (recorded)")
        s.add_argument("--timeout", type=float, default=3600.0, help="seconds per run attempt")
    for name, help_ in FORWARDED.items():
        sub.add_parser(name, help=f"{help_} (python -m repro.bench.{name} --help)", add_help=False)
    return p


def _ints(text: str, what: str, allowed: Sequence[int] | None = None) -> list[int]:
    try:
        values = [int(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"{what}={text!r} is not a list of integers") from None
    if not values or (allowed is not None and any(v not in allowed for v in values)):
        raise ValueError(f"{what}={text!r} is not valid; choose from {list(allowed or ['integers'])}")
    return list(dict.fromkeys(values))


def _plan(args: argparse.Namespace) -> tuple[list[Case], list[int], list[tuple[str, str, str]]]:
    if args.steps < 1:
        raise ValueError(f"--steps={args.steps} is not valid; it must be >= 1")
    if args.retries < 0:
        raise ValueError(f"--retries={args.retries} is not valid; it must be >= 0")
    if args.command == "six-case":
        return _pick(SIX_CASES, args.cases), [args.seed], []
    modes = _ints(args.step_modes, "--step-modes", (0, 1))
    cases = crossover_cases(modes)
    return _pick(cases, args.cases or ",".join(c.name for c in cases)), _ints(args.seeds, "--seeds"), \
        crossover_comparisons(modes)


def _pick(cases: Sequence[Case], text: str) -> list[Case]:
    by_name = {c.name: c for c in cases}
    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in by_name]
    if bad or not names:
        raise ValueError(f"--cases: {bad or text!r} not valid; choose from {list(by_name)}")
    return [by_name[n] for n in names]


def _collect(dirs: Sequence[Path], cases: Sequence[Case], seeds: Sequence[int]) -> list[tuple[dict, Path]]:
    """The rows (and metrics files) of earlier outputs for ``cases`` x ``seeds``, each found once."""
    wanted, found = {c.name for c in cases}, {}
    for d in dirs:
        if not (d / "summary.tsv").is_file():
            raise ValueError(f"--collect: {d} has no summary.tsv (not an output folder of python -m repro.bench)")
        for row in map(parse_summary_row, read_tsv(d / "summary.tsv")):
            if row["case"] not in wanted or row["seed"] not in seeds:
                continue
            key = (row["case"], row["seed"])
            if key in found:
                raise ValueError(f"--collect: {key[0]} seed {key[1]} is in both {found[key][1]} and {d}")
            found[key] = (row, d)
    missing = [f"{c.name} seed {s}" for s in seeds for c in cases if (c.name, s) not in found]
    if missing:
        raise ValueError(f"--collect: no row for {', '.join(missing)} in {[str(d) for d in dirs]}")
    out = []
    for seed in seeds:
        for case in cases:
            row, d = found[(case.name, seed)]
            single = d / case.name / "metrics.tsv"
            out.append((row, single if single.is_file() else d / f"seed{seed}" / case.name / "metrics.tsv"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in FORWARDED:
        return importlib.import_module(f"repro.bench.{argv[0]}").main(argv[1:])
    base = list(DEFAULT_BASE)
    if "--" in argv:
        cut = argv.index("--")
        argv, base = argv[:cut], argv[cut + 1:] or base
    args = _parser().parse_args(argv)
    try:
        cases, seeds, comparisons = _plan(args)
        collected = _collect(args.collect, cases, seeds) if args.collect else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    error = None if collected else validate_base(base, cases[0])
    if error:
        print(f"error: base command line {' '.join(base)!r}: {error.removeprefix('error: ')}", file=sys.stderr)
        return 2
    out = Path(args.outputs_root) / f"{args.run_tag}_{time.strftime('%Y%m%d_%H%M%S')}"
    k = 1
    while out.exists():
        out, k = out.with_name(f"{args.run_tag}_{time.strftime('%Y%m%d_%H%M%S')}_{k}"), k + 1
    out.mkdir(parents=True)
    label = (lambda case, seed: case) if len(seeds) == 1 else (lambda case, seed: f"{case} s{seed}")
    rows, runs, total = [], [], len(cases) * len(seeds)
    if collected:
        print(f"{args.command}: {total} run(s) collected from {', '.join(map(str, args.collect))}; "
              f"outputs: {out}", flush=True)
        rows = [row for row, _ in collected]
        runs = [(label(row["case"], row["seed"]), metrics) for row, metrics in collected]
        write_tsv(out / "summary.tsv", SUMMARY_COLUMNS, rows)
    else:
        print(f"{args.command}: {len(cases)} case(s) x {len(seeds)} seed(s), {args.steps} steps each; "
              f"base: {' '.join(base)}; outputs: {out}", flush=True)
        for seed in seeds:
            for case in cases:
                case_dir = out / case.name if len(seeds) == 1 else out / f"seed{seed}" / case.name
                row = run_case(case, seed, base, steps=args.steps, case_dir=case_dir, retries=args.retries,
                               timeout_s=args.timeout)
                rows.append(row)
                runs.append((label(case.name, seed), case_dir / "metrics.tsv"))
                write_tsv(out / "summary.tsv", SUMMARY_COLUMNS, rows)
                print(_progress(len(rows), total, row), flush=True)
    if comparisons:
        compare = [r for name, a, b in comparisons for r in paired_deltas(rows, a, b, name)]
        write_tsv(out / "compare.tsv", COMPARE_COLUMNS, compare)
        overall = overall_rows(compare)
        write_tsv(out / "overall.tsv", OVERALL_COLUMNS, overall)
        for r in overall:
            print(f"{r['comparison']} {r['metric']}: mean delta {_fmt(r['mean_delta'], '.4g')} over "
                  f"{r['n_seeds']} seed(s), se {_fmt(r['se_delta'], '.3g')}: {r['verdict']}", flush=True)
    print(_plot(out, runs), flush=True)
    failed = [f"{r['case']}/seed {r['seed']}" for r in rows if r["status"] != "ok"]
    print(f"output: {out}" + (f" (failed after retries: {', '.join(failed)})" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
