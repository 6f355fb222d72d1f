#!/usr/bin/env bash
# Batched decode on the lent H200 (issue 19: 64 streams of LFM2-350M Q4_0 >=
# 25,000 tok/s aggregate), from the repo root there, after
# scripts/device/unpack.sh put the release binaries under target/release:
#
#   1. the single and batched GEMVs against the CPU, and the batched ones
#      against the single ones on this adapter (they must agree bit for bit:
#      gemv.wgsl's one order of summation), and the batched row kernels
#      (batched prefill's included: short_conv_rows, prefill_attention_rows
#      against the single kernels bit for bit): target/release/
#      gpu_parity's kernels_match_cpu narrowed to them, when the carried
#      binary is there; and target/release/llm_gpu_batch (every sequence of
#      a batch, batched prefill included, bit-equal to its prompt alone on
#      this adapter's kernels: cooperative-matrix GEMMs and attention) when
#      it is there;
#   2. a random LFM2-350M: $WORK/lfm2-350m-q4_0.gguf when an earlier
#      scripts/device/llm_peer.sh left it (the file llama.cpp runs too),
#      otherwise the HF directory of scripts/device/random_decoder.py with
#      scoreboard's -t q4_0;
#   3. scoreboard --batch 1,8,64,256 -b gpu -p 128 -n 128 on it, with, when
#      a llama.cpp CUDA build is there (scripts/device/llama-cpp.sh; the
#      llama-batched-bench target is built here if it is missing) and the
#      GGUF exists, --llama-batched-bench (-ngl 99 -b 2048 -ub 512) on the
#      same file in the same run: its rows beside ours with the ratio.
#
# Environment: OUT (required), WORK (default /tmp/lfm-llm), BIN (default
# target/release). Results: $OUT/batched-*.{md,txt,log}; a failed step is
# reported and the rest still run; exit status: the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
: "${OUT:?set OUT to the folder for results}"
WORK=${WORK:-/tmp/lfm-llm}
BIN=${BIN:-target/release}
SRC=peers/llama.cpp-cuda
LB=$SRC/build/bin
mkdir -p "$OUT" "$WORK"
failed=0

# step LIMIT NAME COMMAND...: stdout to $OUT/NAME, stderr to $OUT/NAME.log.
step() {
    local limit=$1 name=$2
    shift 2
    if ! timeout -s KILL "$limit" "$@" >"$OUT/$name" 2>"$OUT/$name.log"; then
        echo "batched.sh: $name failed, see $OUT/$name.log" >&2
        tail -5 "$OUT/$name.log" >&2
        failed=$((failed + 1))
        return 1
    fi
}

nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$OUT/batched-env.txt" 2>&1

if [[ -x $BIN/gpu_parity ]]; then
    LFM_PARITY_ONLY=gemv,gemv_add,gemv_norm,gemv_swiglu,gemv_geglu,gemv_conv,gemv_cols,gemv_cols_add,gemv_cols_norm,gemv_cols_swiglu,gemv_cols_geglu,gemv_cols_conv,gemv_sum,gemv_sum_add,gemv_sum_norm,gemv_sum_swiglu,gemv_sum_geglu,gemv_sum_conv,qk_rope_rows,flash_attention_rows,flash_attention_merge_rows,argmax_rows,argmax_part_rows,short_conv,short_conv_rows,prefill_attention,prefill_attention_rows \
        step 300 batched-parity.txt "$BIN/gpu_parity" kernels_match_cpu --nocapture
fi
if [[ -x $BIN/llm_gpu_batch ]]; then
    step 300 batched-batch-tests.txt "$BIN/llm_gpu_batch"
fi

GGUF=$WORK/lfm2-350m-q4_0.gguf
if [[ -f $GGUF ]]; then
    model=("$GGUF")
else
    dir=$WORK/lfm2-350m-random-notok
    [[ -f $dir/config.json ]] ||
        step 300 batched-random.txt python3 scripts/device/random_decoder.py lfm2-350m "$dir"
    model=("$dir" -t q4_0)
fi

# The peer in the same run, its rows beside ours with the ratio, when it
# can run the same file.
peer=()
if [[ -f $GGUF && -f $SRC/build/build.ninja ]]; then
    [[ -x $LB/llama-batched-bench ]] ||
        step 420 batched-llama-build.txt cmake --build "$SRC/build" --target llama-batched-bench -j "$(nproc)"
    [[ -x $LB/llama-batched-bench ]] &&
        peer=(--llama-batched-bench "$LB/llama-batched-bench" --llama-batched-bench-args "-ngl 99 -b 2048 -ub 512")
fi
step 540 batched-scoreboard.md "$BIN/scoreboard" "${model[@]}" -b gpu --batch 1,8,64,256 -p 128 -n 128 "${peer[@]}"

for f in "$OUT"/batched-scoreboard.md; do
    [[ -f $f ]] && { echo "== $f"; cat "$f"; }
done
grep -h "test result" "$OUT/batched-parity.txt" "$OUT/batched-batch-tests.txt" 2>/dev/null
exit "$failed"
