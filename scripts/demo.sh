#!/usr/bin/env bash
# make demo: one chat turn with the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) on the CPU,
# through the paged KV cache and the fused paged attention kernel.
set -euo pipefail
BUILD=${1:-build}
PROMPT=${DEMO_PROMPT:-"What is the capital of France? Answer in one sentence."}
echo "> $PROMPT"
"$BUILD"/pagedattn generate --chat --device cpu --max-tokens 64 --prompt "$PROMPT"
