#!/usr/bin/env bash
# `pagedattn serve` with the default model, driven by curl: completions and chat (plain and
# streamed as server-sent events ending in `data: [DONE]`), models, health, OpenAI-style errors
# with their 4xx status, a body over the size limit, a client that hangs up mid-stream, and the KV
# pages all free again at the end (/metrics). Exit 0: passed; 77: skipped (no model file or no
# curl); anything else: failed.
#   tests/server/test_curl.sh BINARY [MODEL]
set -uo pipefail
binary=$1
model=${2:-$(dirname "$0")/../../models/SmolLM2-135M-Instruct.Q4_1.gguf}
[[ -f $model ]] || { echo "skip: default model not fetched: $model"; exit 77; }
command -v curl >/dev/null || { echo "skip: curl is not installed"; exit 77; }

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base=http://127.0.0.1:$port
work=$(mktemp -d)
"$binary" serve --model "$model" --host 127.0.0.1 --port "$port" --served-model-name smollm2 \
  --kv-cache-memory 64 --max-body-bytes 4096 >"$work/server.log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 600); do
  kill -0 "$pid" 2>/dev/null || fail "server exited early: $(tail -5 "$work/server.log")"
  curl -sf "$base/health" | grep -q '"ok"' && break
  sleep 0.1
done

# POST BODY PATH: prints the HTTP status; the response body goes to $work/out.
post() { curl -s -o "$work/out" -w '%{http_code}' -H 'Content-Type: application/json' -d "$2" "$base$1"; }
metric() { curl -sf "$base/metrics" | awk -v m="$1" 'index($0, m "{") == 1 || $1 == m { print $NF; exit }'; }

used0=$(metric pagedattn_kv_pages_used)
[[ -n $used0 ]] || fail "/metrics has no pagedattn_kv_pages_used"

# Models and a plain completion.
curl -sf "$base/v1/models" | grep -q '"id":"smollm2"' || fail "/v1/models does not list smollm2"
code=$(post /v1/completions '{"model":"smollm2","prompt":"The capital of France is","max_tokens":6,"temperature":0}')
[[ $code == 200 ]] || fail "completion: status $code: $(cat "$work/out")"
python3 - "$work/out" <<'PY' || fail "completion body"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["object"] == "text_completion", r
assert "Paris" in r["choices"][0]["text"], r["choices"][0]["text"]
assert r["usage"]["completion_tokens"] == 6, r["usage"]
PY

# Chat, streamed: data: lines with chunks, the last one data: [DONE]; the text equals the plain one.
chat='{"model":"smollm2","messages":[{"role":"user","content":"Name a colour."}],"max_tokens":8,"temperature":0}'
code=$(post /v1/chat/completions "$chat")
[[ $code == 200 ]] || fail "chat: status $code"
plain=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["message"]["content"])' "$work/out")
curl -sfN -H 'Content-Type: application/json' \
  -d "${chat%\}},\"stream\":true}" "$base/v1/chat/completions" >"$work/sse" || fail "streamed chat"
[[ $(grep -c '^data: ' "$work/sse") -ge 3 ]] || fail "too few server-sent events: $(cat "$work/sse")"
[[ $(grep '^data: ' "$work/sse" | tail -1) == "data: [DONE]" ]] || fail "the stream does not end with data: [DONE]"
streamed=$(python3 - "$work/sse" <<'PY'
import json, sys
text = ""
for line in open(sys.argv[1]):
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        d = json.loads(line[6:])
        assert d["object"] == "chat.completion.chunk", d
        text += d["choices"][0]["delta"].get("content") or ""
print(text)
PY
) || fail "stream chunks"
[[ $streamed == "$plain" ]] || fail "streamed text '$streamed' != plain '$plain'"

# Bad input: the status and an OpenAI error object naming the field.
expect_error() {  # STATUS NEEDLE PATH BODY
  local code
  code=$(post "$3" "$4")
  [[ $code == "$1" ]] || fail "$4: status $code, expected $1"
  grep -q '"error"' "$work/out" || fail "$4: no error object: $(cat "$work/out")"
  grep -q "$2" "$work/out" || fail "$4: the error does not mention $2: $(cat "$work/out")"
}
expect_error 400 "JSON" /v1/completions '{"model":"smollm2","prompt":'
expect_error 400 "max_tokens" /v1/completions '{"model":"smollm2","prompt":"hi","max_tokens":0}'
expect_error 400 "prompt" /v1/completions '{"model":"smollm2","max_tokens":4}'
expect_error 400 "messages" /v1/chat/completions '{"model":"smollm2","messages":"hello"}'
expect_error 404 "model" /v1/completions '{"model":"gpt-unknown","prompt":"hi","max_tokens":4}'
big=$(python3 -c 'print("{\"model\":\"smollm2\",\"prompt\":\"" + "x" * 8000 + "\"}")')
code=$(post /v1/completions "$big")
[[ $code == 413 ]] || fail "a body over --max-body-bytes: status $code, expected 413"

# A client that hangs up mid-stream: the request is cancelled and its pages freed.
curl -sN --max-time 1 -H 'Content-Type: application/json' \
  -d '{"model":"smollm2","prompt":"Once upon a time","max_tokens":400,"stream":true}' \
  "$base/v1/completions" >/dev/null 2>&1
for _ in $(seq 100); do
  [[ $(metric pagedattn_kv_pages_used) == "$used0" ]] && break
  sleep 0.1
done
[[ $(metric pagedattn_kv_pages_used) == "$used0" ]] ||
  fail "pages in use $(metric pagedattn_kv_pages_used) after the hang-up, $used0 at the start"

# SIGTERM: a graceful exit with status 0.
kill -TERM "$pid"
wait "$pid"
status=$?
trap 'rm -rf "$work"' EXIT
[[ $status == 0 ]] || fail "server exit status $status after SIGTERM"
echo "curl checks passed"
