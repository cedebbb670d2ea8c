#!/usr/bin/env python3
"""The CLI's logits of a synthetic model split over N GPUs against one GPU, through the whole
engine (scheduler, step frames, worker processes, CUDA graphs): every logit row within bf16
tolerance of the single-GPU row and the same greedy tokens.

    python3 scripts/device/tp_parity.py BINARY [--model synthetic:llama3-8b] [--tp 2]
"""
import argparse
import json
import random
import subprocess
import sys


def run(binary, model, tp, prompts, steps):
    ids = ";".join(",".join(str(t) for t in p) for p in prompts)
    cmd = [binary, "logits", "--model", model, "--device", "cuda", "--prompt-ids", ids,
           "--decode-steps", str(steps), "--json", "--tensor-parallel", str(tp)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)["sequences"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--model", default="synthetic:llama3-8b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--tol", type=float, default=2e-3)
    a = ap.parse_args()
    rnd = random.Random(3)
    prompts = [[rnd.randrange(1000, 120000) for _ in range(n)] for n in (12, 3, 20)]
    one = run(a.binary, a.model, 1, prompts, a.steps)
    many = run(a.binary, a.model, a.tp, prompts, a.steps)
    assert len(one) == len(many) == len(prompts), (len(one), len(many))
    worst, rows, ok = 0.0, 0, True
    for s1, sn in zip(one, many):
        if s1["generated_ids"] != sn["generated_ids"]:
            print(f"greedy tokens differ: {s1['generated_ids']} vs {sn['generated_ids']}")
            ok = False
        for r1, rn in zip(s1["logits"], sn["logits"]):
            scale = max(1.0, max(abs(v) for v in r1))
            worst = max(worst, max(abs(x - y) for x, y in zip(r1, rn)) / scale)
            rows += 1
    print(f"{a.model}: {rows} logit rows, {a.tp} GPUs vs 1: worst relative error {worst:.2e} "
          f"(tolerance {a.tol}); greedy tokens {'identical' if ok else 'DIFFER'}")
    sys.exit(0 if ok and worst <= a.tol else 1)


if __name__ == "__main__":
    main()
