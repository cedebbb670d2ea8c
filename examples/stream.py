"""Streaming: the text of a request printed as the engine produces it.

    python examples/stream.py [--model PATH] [--device auto|cpu|cuda] [--prompt TEXT] [--chat]
"""

import argparse
import sys

import pagedattn
from pagedattn import SamplingParams


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--prompt", default="Write a short poem about the sea.")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    llm = pagedattn.LLM(args.model, device=args.device, kv_cache_tokens=4096)
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=args.max_tokens)
    if args.chat:
        deltas = llm.chat_stream([{"role": "user", "content": args.prompt}], params)
    else:
        deltas = llm.stream(args.prompt, params)
    finish = None
    for d in deltas:
        sys.stdout.write(d.text)
        sys.stdout.flush()
        finish = d.finish_reason or finish
    print(f"\n[{finish}]")


if __name__ == "__main__":
    main()
