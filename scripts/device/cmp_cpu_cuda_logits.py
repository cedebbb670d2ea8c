#!/usr/bin/env python3
"""Per-position relative logit error between pagedattn on the CPU (fp32) and on CUDA (bf16) for
one model folder of hf_parity.py (its hf_reference.json gives the prompts): where along the
prompts and the greedy decode the two paths part, and each path's first greedy tokens.
    cmp_cpu_cuda_logits.py build-gpu/pagedattn WORKDIR/cuda/llama
"""
import json, subprocess, sys, numpy as np
binary, mdir = sys.argv[1], sys.argv[2]
ref = json.load(open(mdir + "/hf_reference.json"))
ids = ";".join(",".join(map(str, s["prompt_ids"])) for s in ref["sequences"])
out = {}
for dev in ("cpu", "cuda"):
    r = subprocess.run([binary, "logits", "--model", mdir, "--prompt-ids", ids, "--decode-steps", "32", "--device", dev, "--json"], capture_output=True, text=True)
    if r.returncode: print(dev, "failed", r.stderr[-500:]); sys.exit(1)
    out[dev] = json.loads(r.stdout)
for si, (a, b) in enumerate(zip(out["cpu"]["sequences"], out["cuda"]["sequences"])):
    A, B = np.array(a["logits"]), np.array(b["logits"])
    err = np.abs(A - B).max(axis=1) / np.maximum(1, np.abs(A).max(axis=1))
    print(f"seq {si} prompt {len(ref['sequences'][si]['prompt_ids'])}: per-position rel err", " ".join(f"{e:.1e}" for e in err))
    print("  cpu gen", a["generated_ids"][:12], "\n  cuda gen", b["generated_ids"][:12])
