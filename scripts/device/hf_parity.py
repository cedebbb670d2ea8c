#!/usr/bin/env python3
"""Parity of pagedattn's forward pass with Hugging Face transformers on tiny random models.

For Llama, Llama-3, linear and YaRN rope scaling, Qwen2 (QKV bias, tied embeddings) and Qwen3 (q/k
norm, head_dim != hidden / heads) configs: builds a randomly initialised model with transformers,
saves it with save_pretrained (config.json + model.safetensors), takes transformers' greedy
continuation of several prompts and its fp32 logits at every position, then runs

    pagedattn logits --model DIR --prompt-ids "a,b,c;d,e;..." --decode-steps N --json

(all prompts prefilled as one ragged batch, then decoded greedily as one batch through the paged
cache) and checks: greedy tokens identical, logits within a relative error of 1e-4 (max |diff| over
max |reference| per model), CPU fp32. With --device cuda (bf16 weights, activations and KV cache)
the tolerance is 2e-2, the decode steps feed transformers' greedy tokens (--decode-ids: in bf16 a
near tie can flip a greedy choice, after which the two continuations are different texts and
their logits not comparable; how many greedy choices agree is reported), and the models get head
dims the CUDA attention kernels support (64, and 128 for Qwen3) in their own workdir subfolder:
pass --device cuda to both split steps.

Steps can be split across machines (transformers lives on the GPU machine):
    hf_parity.py --workdir W --reference-only        # models + reference (needs torch, transformers)
    hf_parity.py --workdir W --skip-reference        # pagedattn vs the saved reference (numpy only)
Without either flag it does both. Exit status 0 when every check passes.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

TOLERANCE = {"cpu": 1e-4, "cuda": 2e-2}
PROMPT_LENGTHS = (5, 17, 40)

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)

# name -> (transformers config class, model class, overrides)
VARIANTS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "llama3_rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "llama_linear": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "qwen2_yarn": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 128})),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        head_dim=32, num_key_value_heads=1, rms_norm_eps=1e-6)),
}

# --device cuda: head_dim 64 (hidden 256 / 4 heads) and 128 for Qwen3.
CUDA_SHAPES = {"*": dict(hidden_size=256, intermediate_size=512), "qwen3": dict(head_dim=128)}


def variant_overrides(name, over, device):
    if device != "cuda":
        return over
    return {**over, **CUDA_SHAPES["*"], **CUDA_SHAPES.get(name, {})}


def make_reference(workdir, decode_steps, seed, device):
    import torch
    import transformers

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, BASE["vocab_size"], n).tolist() for n in PROMPT_LENGTHS]
    for name, (cfg_cls, model_cls, over) in VARIANTS.items():
        if not hasattr(transformers, model_cls):
            print(f"{name}: transformers {transformers.__version__} has no {model_cls}: skipped")
            continue
        cfg = getattr(transformers, cfg_cls)(**{**BASE, **variant_overrides(name, over, device)})
        cfg._attn_implementation = "eager"
        model = getattr(transformers, model_cls)(cfg).float().eval()
        # NOTE: the default init (std 0.02) gives near-uniform logits whose argmax is decided by
        # rounding noise; unit-scale weights make greedy decisions well separated.
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.copy_(1.0 + 0.2 * (torch.rand_like(p) - 0.5))
                elif pname.endswith("bias"):
                    p.copy_(0.5 * (torch.rand_like(p) - 0.5))
                elif "embed_tokens" in pname:
                    p.copy_(torch.rand_like(p) * 2 - 1)
                else:
                    p.copy_((torch.rand_like(p) * 2 - 1) * (3.0 / p.shape[1]) ** 0.5)
        mdir = os.path.join(workdir, name)
        model.save_pretrained(mdir, safe_serialization=True)
        seqs = []
        with torch.no_grad():
            for ids in prompts:
                inp = torch.tensor([ids])
                out = model.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                     max_new_tokens=decode_steps, min_new_tokens=decode_steps,
                                     pad_token_id=0, eos_token_id=None)
                full = out[0].tolist()
                logits = model(torch.tensor([full])).logits[0].double().numpy()
                seqs.append({"prompt_ids": ids, "generated_ids": full[len(ids):],
                             "logits": logits.tolist()})
        with open(os.path.join(mdir, "hf_reference.json"), "w") as f:
            json.dump({"transformers": transformers.__version__, "torch": torch.__version__,
                       "decode_steps": decode_steps, "sequences": seqs}, f)
        print(f"{name}: reference saved ({len(prompts)} prompts, {decode_steps} greedy steps)")


def compare(workdir, binary, decode_steps, device):
    failures = 0
    results = []
    for name in VARIANTS:
        mdir = os.path.join(workdir, name)
        if not os.path.exists(os.path.join(mdir, "hf_reference.json")):
            print(f"{name}: no reference (skipped)")
            continue
        with open(os.path.join(mdir, "hf_reference.json")) as f:
            ref = json.load(f)
        steps = min(decode_steps, ref["decode_steps"])
        ids = ";".join(",".join(map(str, s["prompt_ids"])) for s in ref["sequences"])
        cmd = [binary, "logits", "--model", mdir, "--prompt-ids", ids, "--decode-steps",
               str(steps), "--device", device, "--json"]
        if device == "cuda":
            cmd += ["--decode-ids",
                    ";".join(",".join(map(str, s["generated_ids"][:steps])) for s in ref["sequences"])]
        t0 = time.time()
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"{name}: pagedattn failed ({run.returncode}): {run.stderr.strip()}")
            failures += 1
            continue
        got = json.loads(run.stdout)
        worst, tokens_ok, agree, total = 0.0, True, 0, 0
        for r, g in zip(ref["sequences"], got["sequences"]):
            n = len(r["prompt_ids"]) + steps
            want = np.array(r["logits"])[:n]
            have = np.array(g["logits"])
            if have.shape != want.shape:
                print(f"{name}: logits shape {have.shape}, expected {want.shape}")
                tokens_ok = False
                continue
            worst = max(worst, float(np.abs(have - want).max() / max(1.0, np.abs(want).max())))
            tokens_ok &= g["generated_ids"] == r["generated_ids"][:steps]
            agree += sum(a == b for a, b in zip(g["generated_ids"], r["generated_ids"][:steps]))
            total += steps
        tol = TOLERANCE[device]
        ok = worst < tol and (tokens_ok or device == "cuda")
        failures += 0 if ok else 1
        results.append({"model": name, "device": device, "max_rel_err": worst,
                        "greedy_tokens_identical": tokens_ok, "greedy_agree": agree,
                        "greedy_total": total, "ok": ok,
                        "seconds": round(time.time() - t0, 3)})
        print(f"{name:12s} {device}: max relative logit error {worst:.2e} (< {tol:g}: "
              f"{worst < tol}), greedy tokens identical: {tokens_ok} ({agree} of {total})")
    with open(os.path.join(workdir, "parity_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return failures


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="out/hf_parity")
    ap.add_argument("--pagedattn", default="build/pagedattn", help="the pagedattn binary")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="pagedattn --device")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference-only", action="store_true")
    ap.add_argument("--skip-reference", action="store_true")
    a = ap.parse_args()
    workdir = a.workdir if a.device == "cpu" else os.path.join(a.workdir, a.device)
    os.makedirs(workdir, exist_ok=True)
    if not a.skip_reference:
        make_reference(workdir, a.decode_steps, a.seed, a.device)
    if a.reference_only:
        return 0
    failures = compare(workdir, a.pagedattn, a.decode_steps, a.device)
    print("hf_parity:", "PASS" if failures == 0 else f"FAIL ({failures} models)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
