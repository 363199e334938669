#!/usr/bin/env bash
# Issue 35's next one-H100 call (written in session 15, not yet run): where the A/B spread comes from.
# Session 15 found runs 2-3 of every four-run sequence about 20% slower whatever their tree, and processes of one
# tree up to 25% apart (results/actor_update/README.md, session 15). Before any further A/B, on one tree:
# 1. six runs in a row, unpinned: does the slowdown follow the position (runs 2-3) or fall at random?
# 2. six runs in a row, each pinned to the same eight cores (PIN): does the spread shrink? (the update is host-bound)
# Every run prints its timed updates' range (`update_s`), so a process's spread shows beside the processes' spread.
# Carry [".whl", ".ab_before"] (ab_device.sh needs the before-tree present, though only this tree runs here).
# As one call:  bash results/actor_update/s15_device.sh
set -u
O=${OUT:-/tmp/out}
R=/tmp/s15_runs
mkdir -p "$O" "$R"
ORDER="after after after after after after" OUT=$R/free bash results/actor_update/ab_device.sh 16384 > "$O/free.txt" 2>&1
ORDER="after after after after after after" PIN=0-7 OUT=$R/pinned bash results/actor_update/ab_device.sh 16384 > "$O/pinned.txt" 2>&1
for d in free pinned; do grep -h '^# round' "$R/$d"/*.log > "$O/${d}_updates.txt"; done  # each run's median and range
tar -czf "$O/runs.tar.gz" -C "$R" .
cat "$O/free.txt" "$O/pinned.txt"
