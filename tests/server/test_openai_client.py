#!/usr/bin/env python3
"""`pagedattn serve` with the default model, driven by the official `openai` client.

Exit 0: passed; 77: skipped (no model file, or the openai package cannot be installed offline);
anything else: failed. The package is pip-installed into --deps when it is missing.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

SKIP = 77


def ensure_openai(deps):
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, deps)
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", deps, "openai"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    if r.returncode != 0:
        print("skip: cannot install the openai package:\n" + r.stdout.decode(errors="replace")[-2000:])
        sys.exit(SKIP)
    import importlib
    importlib.invalidate_caches()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def metric(base, name):
    for line in get(base + "/metrics").splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("metric %s missing" % name)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


API_KEY = "sk-pagedattn-test"


def run_checks(port, model_id):
    import openai
    base = "http://127.0.0.1:%d" % port
    client = openai.OpenAI(base_url=base + "/v1", api_key=API_KEY, timeout=120, max_retries=0)

    ids = [m.id for m in client.models.list().data]
    check(model_id in ids, "models.list: %r lacks %r" % (ids, model_id))
    check(client.models.retrieve(model_id).id == model_id, "models.retrieve")
    try:
        client.models.retrieve("no-such-model")
        raise AssertionError("models.retrieve of an unknown id succeeded")
    except openai.NotFoundError:
        pass
    wrong = openai.OpenAI(base_url=base + "/v1", api_key="sk-wrong", timeout=30, max_retries=0)
    try:
        wrong.models.list()
        raise AssertionError("a wrong API key was accepted")
    except openai.AuthenticationError:
        pass

    c = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    check(len(c.choices) == 1 and c.choices[0].text, "completion text is empty")
    check(c.usage.completion_tokens == 8 and c.choices[0].finish_reason == "length",
          "completion usage/finish: %r" % c)
    check(c.usage.total_tokens == c.usage.prompt_tokens + 8, "usage totals")

    # NOTE: the bare question is a near tie for this 4-bit 135M model at its first token: the
    # int8-activation products (the CPU default) answer it "L'Étoile, ...", --exact-matmul "The
    # capital of France is Paris."; the demo's wording is answered with Paris by both.
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    chat = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=24, temperature=0)
    answer = chat.choices[0].message.content
    check(chat.choices[0].message.role == "assistant", "chat role")
    check("Paris" in answer, "chat answer lacks Paris: %r" % answer)

    stream = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=24,
                                            temperature=0, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    check(streamed == answer, "streamed %r != non-streamed %r" % (streamed, answer))

    many = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=6, n=2,
                                     seed=7, temperature=1.0)
    check(sorted(ch.index for ch in many.choices) == [0, 1], "n=2 choices")
    check(many.usage.completion_tokens == 12, "n=2 usage")

    best = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=6, n=2,
                                     best_of=4, seed=7)
    check(sorted(ch.index for ch in best.choices) == [0, 1], "best_of=4 n=2 choices")
    beam = client.completions.create(model=model_id, prompt="The capital of France is",
                                     max_tokens=8, n=2,
                                     extra_body={"use_beam_search": True, "beam_width": 3})
    check(len(beam.choices) == 2 and "Paris" in beam.choices[0].text,
          "beam search choices: %r" % beam.choices)
    try:
        client.completions.create(model=model_id, prompt="x", max_tokens=2, best_of=3, stream=True)
        raise AssertionError("best_of with stream accepted")
    except openai.BadRequestError as e:
        check("best_of" in str(e), "400 message names best_of")

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        raise AssertionError("unknown model accepted")
    except openai.NotFoundError as e:
        check("no-such-model" in str(e), "404 message names the model")
    try:
        client.completions.create(model=model_id, prompt="x", max_tokens=0)
        raise AssertionError("max_tokens=0 accepted")
    except openai.BadRequestError as e:
        check("max_tokens" in str(e), "400 message names max_tokens")

    # response_format json_object: the answer parses (or, cut by max_tokens, says "length").
    msgs_json = [{"role": "user", "content": "Give a JSON object with the capital of France."}]
    js = client.chat.completions.create(model=model_id, messages=msgs_json, max_tokens=120,
                                        temperature=0, response_format={"type": "json_object"})
    content = js.choices[0].message.content
    if js.choices[0].finish_reason == "stop":
        check(isinstance(json.loads(content), dict), "json_object answer: %r" % content)
    else:
        check(js.choices[0].finish_reason == "length", "json_object finish: %r" % js)
    for bad, name in ((dict(tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
                      (dict(presence_penalty=99), "presence_penalty"),
                      (dict(logit_bias={"x": 1}), "logit_bias")):
        try:
            client.chat.completions.create(model=model_id, messages=msgs, max_tokens=2, **bad)
            raise AssertionError("%s accepted" % name)
        except openai.BadRequestError as e:
            check(name in str(e), "400 message names %s: %s" % (name, e))
    pen = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=8, temperature=0,
                                         presence_penalty=1.0, frequency_penalty=0.5,
                                         logit_bias={"28": -100})
    check(pen.choices[0].message.content is not None, "penalties and logit_bias")
    batch = client.completions.create(model=model_id, prompt=["Hello", "The sky is"], max_tokens=3,
                                      temperature=0, echo=True)
    check(sorted(ch.index for ch in batch.choices) == [0, 1], "a list of prompts: choices")
    check(batch.choices[1].text.startswith("The sky is"), "echo: %r" % batch.choices[1].text)

    for _ in range(100):
        if metric(base, "pagedattn_kv_pages_used") == 0:
            break
        time.sleep(0.05)
    check(metric(base, "pagedattn_kv_pages_used") == 0, "pages still in use after every request")
    check(metric(base, "pagedattn_generation_tokens_total") >= 8 + 12 + 2, "token counter")


def default_model_name(root):
    """DEFAULT_MODEL_NAME of scripts/default-model.sh."""
    with open(os.path.join(root, "scripts", "default-model.sh")) as f:
        for line in f:
            if line.startswith("DEFAULT_MODEL_NAME="):
                return line.split("=", 1)[1].strip()
    raise RuntimeError("scripts/default-model.sh names no DEFAULT_MODEL_NAME")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.join(here, "..", "..")
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", default=os.path.join(root, "models", default_model_name(root)))
    ap.add_argument("--deps", default=os.path.join(tempfile.gettempdir(), "pagedattn-pydeps"))
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print("skip: default model not fetched: " + a.model)
        return SKIP
    ensure_openai(a.deps)

    port = free_port()
    model_id = "smollm2"
    # The API key comes from the environment; /metrics stays open for metric().
    env = dict(os.environ, PAGEDATTN_API_KEY=API_KEY)
    proc = subprocess.Popen([a.binary, "serve", "--model", a.model, "--host", "127.0.0.1", "--port",
                             str(port), "--served-model-name", model_id, "--kv-cache-memory", "64",
                             "--metrics-without-key"], env=env)
    try:
        base = "http://127.0.0.1:%d" % port
        for _ in range(600):
            check(proc.poll() is None, "server exited early with %s" % proc.returncode)
            try:
                if json.loads(get(base + "/health")).get("status") == "ok":
                    break
            except OSError:
                time.sleep(0.1)
        run_checks(port, model_id)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    check(proc.returncode == 0, "server exit status %s after SIGTERM" % proc.returncode)
    print("openai client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
