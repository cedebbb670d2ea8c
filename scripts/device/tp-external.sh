#!/usr/bin/env bash
# One call on a machine with 2 GPUs: a tensor-parallel server whose ranks are started by hand, as
# an external launcher starts them on several hosts (`serve --world-size 2 --rank 0 --init-addr`,
# `tp-worker --rank 1 --init-addr`: NCCL's own TCP bootstrap), with every all-reduce through NCCL
# (PAGEDATTN_PEER_ALL_REDUCE=0, as between hosts); greedy completions of a small quantised GGUF
# model (make_gguf_model.py) against the same server on one GPU. Logs under $OUT.
# NCCL_SOCKETS=1: NCCL's peer-to-peer, shared-memory and InfiniBand transports off, so the two
# ranks' collectives go over TCP sockets (the loopback here), the transport between hosts
# without a faster network.
#   scripts/device/tp-external.sh
#   NCCL_SOCKETS=1 scripts/device/tp-external.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call tp-external 400
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [[ "${NCCL_SOCKETS:-0}" == 1 ]]; then
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo
  export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
fi
step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn ||
  { tail -20 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
bin=$BUILD_DIR/pagedattn
python3 scripts/device/make_gguf_model.py "$OUT/model.gguf" >/dev/null
# The completions of a few prompts from the server on PORT (waits for /health first).
read -r -d '' complete <<'PY'
import json, sys, time, urllib.request
port = sys.argv[1]
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except Exception:
        time.sleep(0.2)
for prompt in ("the thing", "he in the", "Hello world 12345", "x"):
    body = json.dumps({"model": "tp-test", "prompt": prompt, "max_tokens": 24, "temperature": 0,
                       "ignore_eos": True, "logprobs": 1}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"Content-Type": "application/json"})
    out = json.load(urllib.request.urlopen(req, timeout=60))
    c = out["choices"][0]
    print(json.dumps({"prompt": prompt, "text": c["text"],
                      "tokens": out["usage"]["completion_tokens"],
                      "logprobs": c["logprobs"]["token_logprobs"]}))
PY
serve=("$bin" serve --model "$OUT/model.gguf" --device cuda --served-model-name tp-test)
"${serve[@]}" --port 8101 >"$OUT/one.log" 2>&1 &
one=$!
step one-gpu 120 one.jsonl python3 -c "$complete" 8101
kill "$one"; wait "$one" 2>/dev/null
PAGEDATTN_PEER_ALL_REDUCE=0 "${serve[@]}" --port 8102 --world-size 2 --rank 0 \
  --init-addr 127.0.0.1:29531 >"$OUT/rank0.log" 2>&1 &
r0=$!
PAGEDATTN_PEER_ALL_REDUCE=0 "$bin" tp-worker --rank 1 --world-size 2 \
  --init-addr 127.0.0.1:29531 >"$OUT/rank1.log" 2>&1 &
r1=$!
step two-ranks 180 two.jsonl python3 -c "$complete" 8102
kill "$r0"; wait "$r0" 2>/dev/null
for _ in $(seq 1 50); do kill -0 "$r1" 2>/dev/null || break; sleep 0.2; done
kill -0 "$r1" 2>/dev/null && { echo "rank 1 still running after rank 0 ended"; kill -9 "$r1"; }
echo "== one GPU"; cat "$OUT/one.jsonl"
echo "== two ranks started by hand"; cat "$OUT/two.jsonl"
# The same texts and token counts; each token's log-probability within 1e-2.
python3 - "$OUT/one.jsonl" "$OUT/two.jsonl" <<'PY' || tail -n 5 "$OUT/rank0.log" "$OUT/rank1.log"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert a and len(a) == len(b), f"{len(a)} completions on one GPU, {len(b)} on two"
worst = 0.0
for x, y in zip(a, b):
    assert x["text"] == y["text"] and x["tokens"] == y["tokens"], (x["prompt"], x, y)
    worst = max([worst] + [abs(p - q) for p, q in zip(x["logprobs"], y["logprobs"])])
print(f"same completions ({len(a)} prompts); worst log-probability difference {worst:.2e}")
sys.exit(0 if worst <= 1e-2 else 1)
PY
# The transport NCCL chose for the two ranks (NCCL_SOCKETS=1 turns on its INFO lines).
grep -hE "NET/Socket|via NET|via P2P|via SHM" "$OUT/rank0.log" "$OUT/rank1.log" | sort | uniq -c |
  head -8
pgrep -fa "pagedatt[n] (serve|tp-worker)" || echo "no pagedattn process left"
print_summary
