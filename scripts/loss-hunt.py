#!/usr/bin/env python3
"""Seeded random layouts for a hunt for losses: prints `count` runs in the format of
scripts/heldout-sweep.sh (id corpus model parallel context global-batch-tokens cluster), drawn
over every corpus, model preset, cluster preset and context from 8K to 256K, so that a sweep
covers layouts nobody chose. The draw depends on the seed only.

    scripts/loss-hunt.py --seed 33 --count 60 > target/hunt.txt
    SWEEP_RUNS=target/hunt.txt scripts/heldout-sweep.sh

docs/BENCHMARKS.md ("Loss hunt") has the seed-33 hunt's results; R57-R72 of the sweep came from it.
"""
import argparse
import random

CORPORA = ["wikipedia", "prolong_like", "wlbllm_like", "cpython_stdlib", "python-files",
           "java-files", "man-pages", "debian-docs", "rust-files", "cxx-headers", "rust-repos",
           "java-modules", "python-packages", "rust-docs", "perl-modules"]
MODELS = ["llama-7b", "llama-13b", "llama-34b", "llama-70b"]
# The H100 three times as often as each other cluster: the one most runs use.
CLUSTERS = ["h100-sxm", "h100-sxm", "h100-sxm", "h200", "h800", "a100-80g"]
CONTEXTS = [8192, 16384, 32768, 65536, 131072, 262144]
# Corpora of a few million tokens draw 1M-token batches.
SMALL = {"perl-modules", "cpython_stdlib"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--prefix", default="B", help="run ids are PREFIX01, PREFIX02, ...")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for i in range(args.count):
        corpus, model = rng.choice(CORPORA), rng.choice(MODELS)
        cluster, context = rng.choice(CLUSTERS), rng.choice(CONTEXTS)
        tp, pp, dp = rng.choice([2, 4, 8, 8]), rng.choice([1, 2, 4, 8]), rng.choice([2, 4, 8, 16, 32, 64])
        # The large models need model parallelism to hold their states at all.
        if model == "llama-70b" and tp * pp < 16:
            pp, tp = max(pp, 4), 8
        if model == "llama-34b" and tp * pp < 8:
            tp = 8
        tokens = rng.choice([2, 4, 8, 16]) * 2**20
        if corpus in SMALL:
            tokens = min(tokens, 2**20)
        print(f"{args.prefix}{i + 1:02d} {corpus} {model} tp={tp},pp={pp},dp={dp} {context} {tokens} {cluster}")


if __name__ == "__main__":
    main()
