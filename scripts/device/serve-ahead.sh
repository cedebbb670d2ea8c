#!/usr/bin/env bash
# The OpenAI server on one GPU with decode steps scheduled ahead (the CUDA default) against the
# same server with PAGEDATTN_SCHEDULE_AHEAD=0: a small quantised GGUF model (make_gguf_model.py),
# requests one at a time (greedy, seeded sampling with logprobs, stop strings, streaming: the
# same completions both ways), then 32 concurrent clients, some of which hang up mid-stream (every
# answer well formed; afterwards the server is healthy, holds no KV pages and answers again).
# Logs under $OUT.
#   scripts/device/serve-ahead.sh
#   SERVE_ARGS="--tensor-parallel 2" scripts/device/serve-ahead.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/device/steps.sh
begin_call serve-ahead 300
step build 240 build.log env BUILD_DIR="$BUILD_DIR" bash scripts/device/build.sh pagedattn ||
  { tail -20 "$OUT/build.log"; print_summary; exit 1; }
if [[ -f "$BUILD_DIR/deps-env.sh" ]]; then source "$BUILD_DIR/deps-env.sh"; fi
python3 scripts/device/make_gguf_model.py "$OUT/model.gguf" >/dev/null
read -r -d '' clients <<'PY'
import http.client, json, sys, threading, time, urllib.request
port = int(sys.argv[1])
for _ in range(600):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
        break
    except Exception:
        time.sleep(0.2)

def post(body, stream=False, hang_up_after=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if not stream:
        out = json.loads(r.read())
        c.close()
        return out
    text, chunks = "", 0
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        text += json.loads(line[6:])["choices"][0]["text"]
        chunks += 1
        if hang_up_after is not None and chunks >= hang_up_after:
            c.sock.close()  # the client goes away mid-stream
            return None
    c.close()
    return text

prompts = ["the thing", "he in the", "Hello world 12345", "x", "a b c d e f", "once upon"]
def body_of(i):
    body = {"model": "m", "prompt": prompts[i % len(prompts)], "max_tokens": 12 + 5 * (i % 7),
            "temperature": 0}
    if i % 3 == 1:
        body.update(temperature=0.8, top_p=0.95, seed=100 + i, logprobs=2)
    if i % 5 == 2:
        body["stop"] = ["e"]
    return body
def summary(out):
    c = out["choices"][0]
    return [c["text"], out["usage"]["completion_tokens"],
            (c.get("logprobs") or {}).get("token_logprobs")]
# One at a time (the same batches both ways, so the same tokens): compared between the servers.
alone = {str(i): summary(post(body_of(i))) for i in range(12)}
alone["streamed"] = post(dict(body_of(5), stream=True), True)
# Concurrent clients, some streaming, some hanging up mid-stream: every answer well formed.
errors, lock = [], threading.Lock()
def job(i):
    body = body_of(i)
    try:
        if i % 4 == 3:  # streamed; every other one hangs up after three chunks
            out = post(dict(body, stream=True), True, 3 if i % 8 == 3 else None)
            ok = out is None or isinstance(out, str)
        else:
            out = post(body)
            n = out["usage"]["completion_tokens"]
            ok = 1 <= n <= body["max_tokens"] and out["choices"][0]["finish_reason"] in (
                "stop", "length")
        if not ok:
            raise RuntimeError(f"client {i}: {out}")
    except Exception as e:
        with lock:
            errors.append(repr(e))
threads = [threading.Thread(target=job, args=(i,)) for i in range(32)]
for t in threads: t.start()
for t in threads: t.join()
time.sleep(1.0)
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
used = [l for l in metrics.splitlines() if l.startswith("pagedattn_kv_pages_used")]
health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10).status
again = post({"model": "m", "prompt": "the thing", "max_tokens": 8, "temperature": 0})
print(json.dumps({"alone": alone, "errors": errors, "pages_used": used, "health": health,
                  "again": again["choices"][0]["text"]}))
PY
# SERVE_ARGS: more server arguments, e.g. --tensor-parallel 2 (a machine with two GPUs).
serve=("$BUILD_DIR/pagedattn" serve --model "$OUT/model.gguf" --device cuda --served-model-name m
  ${SERVE_ARGS:-})
for v in ahead plain; do
  port=$([[ $v == ahead ]] && echo 8111 || echo 8112)
  env PAGEDATTN_SCHEDULE_AHEAD=$([[ $v == ahead ]] && echo 1 || echo 0) "${serve[@]}" \
    --port "$port" >"$OUT/server_$v.log" 2>&1 &
  pid=$!
  step "clients $v" 120 "clients_$v.json" python3 -c "$clients" "$port"
  kill "$pid"; wait "$pid" 2>/dev/null
done
python3 - "$OUT/clients_ahead.json" "$OUT/clients_plain.json" <<'PY' | tee "$OUT/summary.txt"
import json, sys
a, b = (json.loads(open(f).read().strip().splitlines()[-1]) for f in sys.argv[1:3])
same = a["alone"] == b["alone"] and a["again"] == b["again"]
print(f"one-at-a-time completions the same both ways: {same} ({len(a['alone'])})")
for name, r in (("ahead", a), ("plain", b)):
    print(f"{name}: concurrent clients' errors {r['errors'][:3]}, health {r['health']}, "
          f"{r['pages_used']}, again {r['again']!r}")
ok = same and all(not r["errors"] and r["health"] == 200 and r["pages_used"] and
                  float(r["pages_used"][0].split()[-1]) == 0 for r in (a, b))
print("serve-ahead:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
print_summary | tee -a "$OUT/summary.txt"
