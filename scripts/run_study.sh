#!/usr/bin/env bash
# Run the paper's study on the virtual-time engine and regenerate docs/results.md.
# Every number in docs/results.md comes from the JSON this writes into docs/data/.
# About an hour on 2 cores (the paper-load runs are most of it).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/data
mkdir -p "$out"
all=lru,kvflow,lae,he,pbkv,belady-est
for app in hover codegen swebench financebench taubench; do
  pbkv bench --app "$app" --policies "$all" --json "$out/bench-$app.json"
done
pbkv bench --app hover --policies "$all" --host-kv-tokens 0 --json "$out/bench-hover-nohost.json"
pbkv bench --app hover --policies pbkv --predictor oracle --json "$out/bench-hover-oracle.json"
pbkv bench --app codegen --policies lru,he,pbkv --predictor graphsage --train-workflows 1000 \
  --json "$out/bench-codegen-graphsage.json"
pbkv sweep concurrency --app hover --policies "$all" --values 2,4,8,16,32 --out-dir "$out"
pbkv sweep horizon --app hover --policies pbkv --values 1,2,3,4,5 --out-dir "$out"
pbkv sweep noise --app hover --policies lru,he,pbkv,pbkv-aggressive --values 0,0.1,0.2,0.3,0.5,0.8,1 \
  --out-dir "$out"
pbkv trace-plot --app hover --policies lru,lae,he,pbkv,belady-est --out "$out/hit-timeline-hover.png"
# the paper's loads, where the cache is contested (issue 13); lru:workflow and pbkv:fcfs split
# the scheduler's share of a gain from the policy's
paper=lru,lru:workflow,he,pbkv:fcfs,pbkv
pbkv bench --app hover --workflows 144 --concurrency 72 --policies "$paper" \
  --json "$out/bench-hover-c72.json"
pbkv bench --app swebench --workflows 96 --concurrency 24 --policies "$paper" \
  --json "$out/bench-swebench-c24.json"
pbkv bench --app financebench --workflows 96 --concurrency 48 --policies "$paper" \
  --json "$out/bench-financebench-c48.json"
pbkv bench --app taubench --workflows 144 --concurrency 48 --policies "$paper" \
  --json "$out/bench-taubench-c48.json"
pbkv bench --app hover --workflows 144 --concurrency 72 --policies "$paper" --hardware h200 \
  --json "$out/bench-hover-c72-h200.json"
pbkv sweep concurrency --app hover --workflows 144 --policies lru,lru:workflow,pbkv \
  --values 8,16,32,48,72,96 --out-dir "$out/paper-load"
python scripts/make_results.py "$out" docs/results.md
