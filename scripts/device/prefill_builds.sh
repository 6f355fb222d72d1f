#!/usr/bin/env bash
# Prefill of several lfm builds on one model, rounds alternated, then a
# device-time profile of each build's prefill: for bisecting a prefill
# change on the lent GPU (the forty-sixth session's LFM2-350M pp512 fall,
# BENCHMARKS.md). From the repo root there, after scripts/device/unpack.sh:
#
#   scripts/device/prefill_builds.sh MODEL BUILD...
#
# MODEL: a GGUF or an HF directory (e.g. scripts/fixtures/lfm2_350m_random.py's,
# made there with --tokenizer .dev/lfm2-tok). BUILD: an lfm binary, or
# BINARY:SHADERS to run it with LFM_SHADER_DIR=SHADERS (a folder of every
# kernel file: HEAD's shaders/ with one file taken from another commit).
# Environment: TYPE (default q4_0; empty for the file's own types), P
# (default 512), R (repetitions, default 2), ROUNDS (default 2). Results on
# stdout, one table row per build and round, then the profiles.
set -uo pipefail
model=$1
shift
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
type=(${TYPE-q4_0})
[[ ${#type[@]} -gt 0 ]] && type=(-t "${type[0]}")
run() {
    local build=$1
    shift
    local bin=${build%%:*} shaders=
    [[ $build == *:* ]] && shaders=${build#*:}
    env ${shaders:+LFM_SHADER_DIR="$shaders"} timeout -s KILL 120 "$bin" scoreboard "$model" "${type[@]}" -b gpu \
        -p "${P:-512}" -n 0 "$@" 2>&1
}
for round in $(seq "${ROUNDS:-2}"); do
    for build in "$@"; do
        echo "## round $round: $build"
        run "$build" -r "${R:-2}" | grep '| lfm'
    done
done
for build in "$@"; do
    echo "## profile: $build"
    run "$build" -r 1 --profile 1 | awk '/^prefill/ { on = 1 } on { print } on && /^$/ && ++blank == 2 { exit }'
done
