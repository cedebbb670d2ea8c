#!/usr/bin/env bash
# `pagedattn serve` with the default model, driven by curl: completions and chat (plain and
# streamed as server-sent events ending in `data: [DONE]`), models, health, OpenAI-style errors
# with their 4xx status, a body over the size limit, a client that hangs up mid-stream, the KV pages
# all free again after it (/metrics), and SIGTERM with a stream in flight (the stream ends, the
# server exits 0). Exit 0: passed; 77: skipped (no model file or no curl); anything else: failed.
#   tests/server/test_curl.sh BINARY [MODEL]
set -uo pipefail
binary=$1
source "$(dirname "$0")/../../scripts/default-model.sh"
model=${2:-$(dirname "$0")/../../models/$DEFAULT_MODEL_NAME}
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
# The same body chunked (no Content-Length) stops at the limit too; wrong methods get 405.
printf '%s' "$big" >"$work/big.json"
code=$(curl -s -o "$work/out" -w '%{http_code}' -H 'Content-Type: application/json' \
  -H 'Transfer-Encoding: chunked' --data-binary @"$work/big.json" "$base/v1/completions")
[[ $code == 413 ]] || fail "a chunked body over --max-body-bytes: status $code, expected 413"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/v1/completions")
[[ $code == 405 ]] || fail "GET /v1/completions: status $code, expected 405"
code=$(curl -s -o "$work/out" -w '%{http_code}' "$base/v1/models/smollm2")
[[ $code == 200 ]] || fail "GET /v1/models/smollm2: status $code, expected 200"

# A client that gives up on a non-streamed request: it is cancelled and its pages freed.
cancelled0=$(metric pagedattn_request_cancelled_total)
curl -s --max-time 1 -H 'Content-Type: application/json' \
  -d '{"model":"smollm2","prompt":"Once upon a time","max_tokens":2000,"ignore_eos":true}' \
  "$base/v1/completions" >/dev/null 2>&1
more() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > float(sys.argv[2]) else 1)" "$@"; }
# NOTE: on a loaded machine the prompt may reach the engine after the client has gone; it is
# cancelled as soon as it does (2,000 tokens would take minutes).
for _ in $(seq 300); do
  more "$(metric pagedattn_request_cancelled_total)" "$cancelled0" && break
  sleep 0.1
done
more "$(metric pagedattn_request_cancelled_total)" "$cancelled0" ||
  fail "an abandoned non-streamed request was not cancelled"
[[ $(metric pagedattn_kv_pages_used) == "$used0" ]] || fail "an abandoned request still holds pages"

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

# SIGTERM with a streamed request in flight: the request is cancelled (its stream gets an error
# event, a last chunk with finish_reason "length": OpenAI has no value for a request the server
# ends; then data: [DONE], and ends), and the server exits 0 within a bound.
# The request asks for far more tokens than it can make before the signal, and ignores eos.
curl -sN --max-time 60 -H 'Content-Type: application/json' \
  -d '{"model":"smollm2","prompt":"Once upon a time","max_tokens":1000,"ignore_eos":true,"temperature":0,"stream":true}' \
  "$base/v1/completions" >"$work/inflight" 2>"$work/inflight.err" &
client=$!
trap 'kill "$client" 2>/dev/null; cleanup' EXIT
for _ in $(seq 300); do
  [[ $(grep -c '^data: ' "$work/inflight") -ge 2 ]] && break
  sleep 0.1
done
[[ $(grep -c '^data: ' "$work/inflight") -ge 2 ]] || fail "the stream to interrupt sent no tokens"
kill -TERM "$pid"
signalled=$(date +%s%N)
for _ in $(seq 200); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  kill -KILL "$pid"
  fail "the server still runs 20 s after SIGTERM with a request in flight"
fi
wait "$pid"
status=$?
trap 'kill "$client" 2>/dev/null; rm -rf "$work"' EXIT
[[ $status == 0 ]] || fail "server exit status $status after SIGTERM with a request in flight"
wait "$client"
client_status=$?
[[ $client_status == 0 ]] ||
  fail "the interrupted stream did not end cleanly (curl status $client_status: $(cat "$work/inflight.err"))"
[[ $(grep '^data: ' "$work/inflight" | tail -1) == "data: [DONE]" ]] ||
  fail "the interrupted stream does not end with data: [DONE]: $(tail -3 "$work/inflight")"
python3 - "$work/inflight" <<'PY' || fail "the interrupted stream's last chunk"
import json, sys
events = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: {")]
# Completion chunks, and maybe an OpenAI error event saying why the request ends.
chunks = [e for e in events if "error" not in e]
for e in events:
    assert "choices" in e or "message" in e.get("error", {}), e
finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
assert finish and finish[-1] == "length", "last finish_reason %r, expected length" % finish[-1:]
assert all(f is None for f in finish[:-1]), finish
PY
echo "SIGTERM with a stream in flight: exit 0 after $((($(date +%s%N) - signalled) / 1000000)) ms"
echo "curl checks passed"
