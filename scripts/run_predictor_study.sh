#!/usr/bin/env bash
# The predictor study (issue: GraphSAGE vs Markov): accuracy on codegen and taubench,
# forecast latency and training time. Writes docs/data/predictor-*.json; then run
# scripts/make_results.py (run_study.sh does) to refresh docs/results.md.
# About 10 minutes on 2 cores once the text embeddings are cached (~/.cache/pbkv);
# the first run embeds ~3,700 tau-bench step texts with SmolLM2 (about 15 minutes more).
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/data
work=out/predictor-study  # traces and checkpoints (git-ignored)
mkdir -p "$out" "$work"
predictors=markov-1,markov-2,markov-3,graphsage,graphsage-notext

# codegen: train on 1,000 generated workflows, score 300 others (task text, SmolLM2);
# a 3-member ensemble, timed as one forecast of 1,024 states
pbkv trace generate --app codegen --workflows 1000 --seed 1 --out "$work/codegen-train.jsonl"
pbkv trace generate --app codegen --workflows 300 --seed 2 --out "$work/codegen-test.jsonl"
pbkv train --app codegen --traces "$work/codegen-train.jsonl" --out "$work/ckpt-codegen" \
  --members 3
pbkv eval-predictor --app codegen --traces "$work/codegen-test.jsonl" \
  --checkpoint "$work/ckpt-codegen" --predictors "$predictors" \
  --json "$out/predictor-codegen.json"
pbkv bench-predictor --checkpoint "$work/ckpt-codegen" --json "$out/predictor-latency.json"

# taubench: the 200 real episodes; 5-fold cross-validation by task (each fold trains every
# predictor on the other 40 tasks), with each step's newest messages as the text; graphsage
# as a 3-member ensemble and as one model
pbkv trace generate --app taubench --workflows 200 --seed 0 --out "$work/tau.jsonl"
for members in 3 1; do
  pbkv eval-predictor --app taubench --traces "$work/tau.jsonl" --folds 5 --members "$members" \
    --predictors "$predictors" --text-encoder smollm2 --text-source step \
    --json "$out/predictor-taubench-cv-members$members.json"
done
