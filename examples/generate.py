"""Offline batch generation with the continuous-batching engine.

    python examples/generate.py [--model PATH] [--device auto|cpu|cuda] [--max-tokens 32]
"""

import argparse
import time

import pagedattn
from pagedattn import SamplingParams

PROMPTS = [
    "The capital of France is",
    "The three primary colours are",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a .gguf file or HF folder (default model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    args = ap.parse_args()
    llm = pagedattn.LLM(args.model, device=args.device, kv_cache_tokens=8192)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    t0 = time.perf_counter()
    outputs = llm.generate(PROMPTS, params)
    dt = time.perf_counter() - t0
    tokens = 0
    for out in outputs:
        c = out.outputs[0]
        tokens += len(c.token_ids)
        print(f"{out.prompt!r} -> {c.text!r} ({c.finish_reason})")
    print(f"{len(outputs)} prompts, {tokens} tokens in {dt:.2f} s on {llm.device}")
    reply = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                     SamplingParams(temperature=0, max_tokens=24))
    print(f"chat: {reply.outputs[0].text!r}")


if __name__ == "__main__":
    main()
