# The benchmark scenarios of docs/BENCHMARKS.md, one place for every script that runs them
# (bench-scenarios.sh, eqsat-gain.sh): the layout, context, batch size and dataset of each.
# Sourced from the repository root.
DATA=../shared/data
HELDOUT=target/heldout
ORDER=(S1 S2 S3 S4 S5 S6 S7 H1 H2 H3 H4 H5 H6 H7)
declare -A SCENARIOS=(
    [S1]="--model llama-7b --parallel tp=4,pp=2,dp=16 --context 65536 --global-batch-tokens 8388608 --dataset $DATA/wikipedia.lengths.txt"
    [S2]="--model llama-13b --parallel tp=8,pp=2,dp=8 --context 131072 --global-batch-tokens 16777216 --dataset $DATA/prolong_like.lengths.txt"
    [S3]="--model llama-34b --parallel tp=8,pp=4,dp=8 --context 262144 --global-batch-tokens 16777216 --dataset $DATA/wlbllm_like.lengths.txt"
    [S4]="--model llama-70b --parallel tp=8,pp=8,dp=4 --context 262144 --global-batch-tokens 16777216 --dataset $DATA/wikipedia.lengths.txt"
    [S5]="--model llama-150b --parallel tp=8,pp=16,dp=2 --context 262144 --global-batch-tokens 16777216 --dataset $DATA/wikipedia.lengths.txt"
    [S6]="--model llama-70b --parallel tp=8,pp=8,dp=4 --context 262144 --global-batch-tokens 16777216 --dataset $DATA/wlbllm_like.lengths.txt"
    [S7]="--model llama-7b --parallel tp=8,pp=1,dp=16 --context 131072 --global-batch-tokens 16777216 --dataset $DATA/prolong_like.lengths.txt"
    # Held-out: source files (Python packages, the JDK), repository-level code (one document
    # per crate, cut at the context), manual pages, Debian changelogs and copyright files.
    [H1]="--model llama-13b --parallel tp=8,pp=2,dp=8 --context 131072 --global-batch-tokens 16777216 --dataset $HELDOUT/python-files.lengths.txt"
    [H2]="--model llama-7b --parallel tp=4,pp=2,dp=16 --context 65536 --global-batch-tokens 16777216 --dataset $HELDOUT/java-files.lengths.txt"
    [H3]="--model llama-70b --parallel tp=8,pp=8,dp=4 --context 262144 --global-batch-tokens 16777216 --dataset $HELDOUT/rust-repos.lengths.txt"
    [H4]="--model llama-7b --parallel tp=4,pp=2,dp=16 --context 65536 --global-batch-tokens 8388608 --dataset $HELDOUT/man-pages.lengths.txt"
    [H5]="--model llama-34b --parallel tp=8,pp=4,dp=8 --context 262144 --global-batch-tokens 16777216 --dataset $HELDOUT/debian-docs.lengths.txt"
    # Added later, never used to develop or tune slimpack: C and C++ headers (LLVM's and the
    # system's, one document per file) and Rust source files (one per file), on layouts the
    # others do not use (pp=4 at 128K; 70B at 64K).
    [H6]="--model llama-13b --parallel tp=8,pp=4,dp=4 --context 131072 --global-batch-tokens 16777216 --dataset $HELDOUT/cxx-headers.lengths.txt"
    [H7]="--model llama-70b --parallel tp=8,pp=4,dp=8 --context 65536 --global-batch-tokens 8388608 --dataset $HELDOUT/rust-files.lengths.txt"
)

# Builds those of the named held-out corpora not built yet into $HELDOUT (scripts/heldout-corpora.py,
# tokenized by the slimpack binary given first); a name given twice is built once.
build_missing_heldout() {
    local slimpack=$1 name
    shift
    local missing=()
    for name in "$@"; do
        if [ ! -f "$HELDOUT/$name.lengths.txt" ] && [[ " ${missing[*]} " != *" $name "* ]]; then
            missing+=("$name")
        fi
    done
    if [ ${#missing[@]} -gt 0 ]; then
        python3 scripts/heldout-corpora.py --slimpack "$slimpack" --out "$HELDOUT" "${missing[@]}"
    fi
}
