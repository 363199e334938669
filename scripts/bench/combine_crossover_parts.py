"""Join the summary.tsv of a crossover run cut short by the device's time limit with the run that
finished its missing cases, and write summary/compare/overall.tsv as `python -m repro.bench crossover` does.

    PYTHONPATH=$PWD python scripts/bench/combine_crossover_parts.py
"""
from repro.bench.rl_cases import crossover_comparisons
from repro.bench.summary import (
    COMPARE_COLUMNS,
    OVERALL_COLUMNS,
    SUMMARY_COLUMNS,
    overall_rows,
    paired_deltas,
    read_tsv,
    write_tsv,
)

d = "results/bench/crossover/"
rows = read_tsv(d + "summary_part1.tsv") + read_tsv(d + "summary_part2.tsv")
for r in rows:  # read_tsv gives strings; the summary math wants numbers
    for k, v in r.items():
        if k not in ("case", "status") and v not in ("", None):
            try:
                r[k] = int(v) if k in ("seed", "retries", "steps") else float(v)
            except ValueError:
                pass
write_tsv(d + "summary.tsv", SUMMARY_COLUMNS, rows)
compare = [r for name, a, b in crossover_comparisons([0, 1]) for r in paired_deltas(rows, a, b, name)]
write_tsv(d + "compare.tsv", COMPARE_COLUMNS, compare)
overall = overall_rows(compare)
write_tsv(d + "overall.tsv", OVERALL_COLUMNS, overall)
for r in overall:
    print(r["comparison"], r["metric"], r["mean_delta"], r["se_delta"], r["n_seeds"], r["verdict"])
