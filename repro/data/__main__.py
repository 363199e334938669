"""Command line for the data tools.

    python -m repro.data gsm8k --jsonl-dir DIR --out DIR     # GSM8K jsonl -> train/test.parquet
    python -m repro.data arith --out DIR --seed S [--n-train N --n-val N --digits 2,1]
    python -m repro.data tiny-policy --out DIR [--seed S --threshold 0.25]
    python -m repro.data policy NAME [--out DIR]          # a built-in policy: tiny, qwen3-0.6b-arith
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time


def _digits(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--digits {text!r}: expected comma-separated integers like 2,1") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m repro.data", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("gsm8k", help="convert GSM8K jsonl files to verl-schema parquet")
    g.add_argument("--jsonl-dir", required=True, help="folder with train.jsonl and test.jsonl")
    g.add_argument("--out", required=True, help="output folder for train.parquet and test.parquet")
    g.add_argument("--splits", default="train,test", help="comma-separated splits (default train,test)")

    a = sub.add_parser("arith", help="write the synthetic arithmetic task as parquet")
    a.add_argument("--out", required=True)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--n-train", type=int, default=2048)
    a.add_argument("--n-val", type=int, default=256)
    a.add_argument("--digits", type=_digits, default=(2, 1), help="digits per operand, e.g. 2,1 or 2,2,1")

    t = sub.add_parser("tiny-policy", help="build (or copy from cache) the SFT-warm-started tiny policy")
    t.add_argument("--out", required=True, help="model folder to write (a valid model.path)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threshold", type=float, default=None, help="held-out accuracy that stops SFT")
    b = sub.add_parser("policy", help="build (or find in the cache) a built-in policy and print its figures")
    b.add_argument("name", help="tiny or qwen3-0.6b-arith (repro.data.policies)")
    b.add_argument("--out", default=None, help="also copy it to this folder")
    return p


REPORT_KEYS = ("num_parameters", "sft_steps", "accuracy_before", "accuracy_after", "build_seconds", "device", "key")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.cmd == "gsm8k":
            from repro.data.gsm8k import convert

            paths = convert(args.jsonl_dir, args.out, tuple(s for s in args.splits.split(",") if s))
            import pyarrow.parquet as pq

            for split, path in paths.items():
                print(f"{split}: {pq.read_metadata(path).num_rows} rows -> {path}")
        elif args.cmd == "arith":
            from repro.data.arith import write_parquet

            train, val = write_parquet(args.out, args.seed, args.n_train, args.n_val, args.digits)
            print(f"train -> {train}\nval -> {val}")
        elif args.cmd == "policy":
            from repro.data.policies import built_in
            from repro.data.sft import read_report

            logging.basicConfig(level=logging.INFO, format="%(message)s")
            policy = built_in(args.name)
            out = policy.ensure(args.out)
            report = read_report(out) or {}
            print(json.dumps({k: report.get(k) for k in REPORT_KEYS}))
            print(f"{policy.name} policy -> {out}")
        else:
            from repro.data.sft import SFTRecipe, ensure_tiny_policy, read_report

            logging.basicConfig(level=logging.INFO, format="%(message)s")
            kwargs = {"seed": args.seed}
            if args.threshold is not None:
                kwargs["threshold"] = args.threshold
            out = ensure_tiny_policy(args.out, SFTRecipe(**kwargs))
            report = read_report(out) or {}
            print(json.dumps({k: report.get(k) for k in REPORT_KEYS}))
            print(f"tiny policy -> {out}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"done in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
