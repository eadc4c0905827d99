#!/usr/bin/env bash
# eqsat's gain and cost per scenario (docs/BENCHMARKS.md, "eqsat: gain and cost"): the
# configuration slimpack keeps in each scenario where it keeps its own pipeline, compiled on
# steps 1..N with eqsat and rank merging (`eqsat{ranks=true}`), with eqsat's default (no rank
# merging), and without eqsat; the simulated step time of each and the compile time of the whole pipeline
# (single process, verifier off).
#
#   scripts/eqsat-gain.sh            # S1 S4 S5 S6 S7 H4, 5 steps each
#   STEPS=3 scripts/eqsat-gain.sh S7
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-5}
source scripts/scenarios.sh
# scenario -> "assign and grouping passes|slice|cap|recompute": the configuration
# scripts/bench-scenarios.sh's slimpack kept at commit e2a1577 (see the scoreboard).
declare -A KEPT=(
    [S1]="assign-dp{cp=2}|32768|65536|none"
    [S4]="assign-dp{cp=4}|32768|65536|none"
    [S5]="assign-dp{cp=2}|32768|65536|full"
    [S6]="assign-dp{cp=4}|32768|65536|none"
    [S7]="assign-dp,dp-merge{memory=0.5}|16384|32768|none"
    [H4]="assign-dp{cp=2}|32768|65536|none"
)
ids=("$@")
[ ${#ids[@]} -gt 0 ] || ids=(S1 S4 S5 S6 S7 H4)
for id in "${ids[@]}"; do
    if [ -z "${KEPT[$id]+set}" ]; then
        echo "error: no kept configuration for scenario '$id' (valid: ${!KEPT[*]})" >&2
        exit 2
    fi
done
S=${CARGO_TARGET_DIR:-target}/release/slimpack
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' scenario step "step s ranks=true" "eqsat" "no eqsat" \
    "compile ms ranks=true" "eqsat" "no eqsat"
for id in "${ids[@]}"; do
    IFS='|' read -r grouping size cap recompute <<<"${KEPT[$id]}"
    job=${SCENARIOS[$id]/--dataset/--batch}
    base="$grouping,slice{size=$size},pack-fwd{cap=$cap},pack-bwd{cap=$cap}"
    for step in $(seq 1 "$STEPS"); do
        row=("$id" "$step")
        times=()
        for eqsat in "eqsat{ranks=true}," "eqsat," ""; do
            # shellcheck disable=SC2086 # the job's flags split on spaces
            report=$("$S" compile $job --cluster h100-sxm --step "$step" --recompute "$recompute" \
                --passes "$base,${eqsat}schedule-pipeline" --no-verify --allow-oom --report json)
            row+=("$(jq -r '.step_time_s' <<<"$report")")
            times+=("$(jq -r '[.passes[].ms] | add | floor' <<<"$report")")
        done
        printf '%s\t' "${row[@]}" "${times[@]}"
        printf '\n'
    done
done
