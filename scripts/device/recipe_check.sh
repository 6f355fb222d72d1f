#!/usr/bin/env bash
# The decoder recipe on the lent H200, in one call from the repo root there
# after scripts/device/unpack.sh: kernel and model parity on real hardware
# (subgroups, cooperative matrices: the variants lavapipe cannot run), the GPU
# against the CPU on random checkpoints of real shapes (gemma-3-270m: GeGLU,
# post-norms, sliding windows, 262k vocabulary; LFM2-350M), and their decode
# and prefill speed (scoreboard, weights converted to q4_0 at load).
# Environment: OUT (required). Results: $OUT/*.log, *.md. Exit status: the
# number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?set OUT}"
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
B=target/release
W=/tmp/lfm-recipe
mkdir -p "$W"
failed=0
step() {
    local limit=$1 name=$2
    shift 2
    echo "== $name" >&2
    if ! timeout -s KILL "$limit" "$@" >"$OUT/$name.log" 2>&1; then
        echo "recipe_check.sh: $name failed" >&2
        tail -5 "$OUT/$name.log" >&2
        failed=$((failed + 1))
    fi
}
step 300 gpu_parity $B/gpu_parity
# SmolLM2 is not carried (94 MB): its two tests are left out.
step 240 llm_gpu $B/llm_gpu --skip smollm2 --skip generate_runs_on_the_gpu
for m in gemma3-270m lfm2-350m; do
    [[ -f $W/$m/model.safetensors ]] || step 240 "make_$m" python3 scripts/device/random_decoder.py "$m" "$W/$m"
    step 240 "check_$m" $B/examples/llm_gpu_check "$W/$m" --type q4_0 --prompt 16 --steps 8
done
step 400 scoreboard $B/scoreboard "$W/gemma3-270m" "$W/lfm2-350m" -b gpu -t q4_0,f16 -p 512 -n 128 -r 3
exit $failed
