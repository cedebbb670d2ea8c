#!/usr/bin/env python3
"""A model's logits on one GPU with the RMSNorms folded into the products and without
(PAGEDATTN_FOLD_NORM=0), and on the CPU, teacher-forced along the CPU run's greedy tokens so all
three see the same inputs: the worst difference of each pair relative to the row's largest logit,
and per sequence the rows where the folded run parts from the other two.
    python3 scripts/device/fold_parity.py BINARY MODEL [--tp N]
"""
import argparse, json, os, random, subprocess, sys


def run(binary, model, device, prompts, steps, forced=None, env=None, tp=1, extra=()):
    ids = ";".join(",".join(map(str, p)) for p in prompts)
    cmd = [binary, "logits", "--model", model, "--device", device, "--prompt-ids", ids,
           "--decode-steps", str(steps), "--json", *extra]
    if tp > 1:
        cmd += ["--tensor-parallel", str(tp)]
    if forced:
        cmd += ["--decode-ids", ";".join(",".join(map(str, f)) for f in forced)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, **(env or {})))
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)["sequences"]


def worst(a, b):
    w, where = 0.0, None
    for si, (s1, s2) in enumerate(zip(a, b)):
        for ri, (r1, r2) in enumerate(zip(s1["logits"], s2["logits"])):
            d = max(abs(x - y) for x, y in zip(r1, r2)) / max(1.0, max(abs(v) for v in r1))
            if d > w:
                w, where = d, (si, ri)
    return w, where


ap = argparse.ArgumentParser()
ap.add_argument("binary")
ap.add_argument("model")
ap.add_argument("--vocab", type=int, default=256)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--tp", type=int, default=2)
a = ap.parse_args()
rnd = random.Random(3)
prompts = [[rnd.randrange(1, a.vocab) for _ in range(n)] for n in (12, 3, 20)]
cpu = run(a.binary, a.model, "cpu", prompts, a.steps)
forced = [s["generated_ids"] for s in cpu]
runs = {"cpu exact": run(a.binary, a.model, "cpu", prompts, a.steps, forced,
                         extra=("--exact-matmul",)),
        "cpu": cpu,
        "cuda folded": run(a.binary, a.model, "cuda", prompts, a.steps, forced),
        "cuda unfolded": run(a.binary, a.model, "cuda", prompts, a.steps, forced,
                             {"PAGEDATTN_FOLD_NORM": "0"})}
if a.tp > 1:
    runs[f"cuda tp{a.tp}"] = run(a.binary, a.model, "cuda", prompts, a.steps, forced, tp=a.tp)
names = list(runs)
for i in range(len(names)):
    for j in range(i + 1, len(names)):
        w, where = worst(runs[names[i]], runs[names[j]])
        print(f"{names[i]:>14} vs {names[j]:<14} worst relative difference {w:.2e} at {where}")

# Row by row: each run against the exact CPU path.
ref = runs["cpu exact"]
for name in names[1:]:
    per = []
    for s1, s2 in zip(ref, runs[name]):
        per.append(" ".join("%.2f" % (max(abs(x - y) for x, y in zip(r1, r2)) /
                                      max(1.0, max(abs(v) for v in r1)))
                            for r1, r2 in zip(s1["logits"], s2["logits"])))
    print(f"{name} vs cpu exact, per row:\n  " + "\n  ".join(per))
