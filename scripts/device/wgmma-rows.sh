#!/usr/bin/env bash
# One GPU call for the 64-row versions of wgmma_gemm (src/model/cuda/wgmma_gemm.h): the gemv.sh
# call (build, the wgmma and model tests, the model with the default pick against cuBLAS and
# against version 1 everywhere), then Nsight Compute on one product (SHAPE, default Llama-3-8B's o
# at 32 tokens) for cuBLAS and versions 1, 5 and 6. Logs under $OUT.
#   scripts/device/wgmma-rows.sh
# Environment: as gemv.sh; SHAPE (T:N:K), SKIP_PROFILE.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out/wgmma-rows}
export OUT
LAB=wgmma_gemm_lab SKIP_LAB=${SKIP_LAB-1} GPU_FILTER=${GPU_FILTER:-'WgmmaGemm*:Gemv*:LlamaCuda*'} \
  MODEL_BATCHES=${MODEL_BATCHES:-4,8,16,32,64} AB_VAR=PAGEDATTN_WGMMA_GEMM \
  AB_VALUES=${AB_VALUES:-"auto 0 PAGEDATTN_WGMMA_GEMM_VERSION=1"} BUDGET=${BUDGET:-420} \
  bash scripts/device/gemv.sh
[[ -n "${SKIP_PROFILE:-}" ]] ||
  OUT="$OUT/profile" timeout 150 bash scripts/device/profile-wgmma-gemm.sh "${SHAPE:-32:4096:4096}"
