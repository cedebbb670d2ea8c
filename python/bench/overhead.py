"""What a call through Python costs over the same call from C++: a decode step of the paged
attention operator at batch 1 (and a few more shapes), timed with CUDA events around many calls.

    python python/bench/overhead.py [--device cuda|cpu] [--iters 2000] [--rounds 5] [--json]

For each shape, three loops of the same launches on the same stream, interleaved over rounds
(the median is reported):
  cpp_oneshot   : plan + run per call from a C++ loop (pagedattn._C._paged_attention_repeated)
  py_oneshot    : pagedattn.paged_attention(q, ...) per call from Python (plan + run inside)
  cpp_plan_run  : AttentionPlan's run per call from a C++ loop
  py_plan_run   : plan.run(q, ...) per call from Python
The overhead is py - cpp per call in microseconds; the goal is at most 5 us at batch 1 on CUDA.
Every loop writes into a preallocated out (no allocation in the loop). Needs torch for CUDA
tensors and events; on the CPU it uses numpy and wall-clock time.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import pagedattn
from pagedattn import _C


def make_batch(batch, kv_len, hq, hk, d, page_size, device, torch):
    rng = np.random.default_rng(0)
    pages_per_seq = (kv_len + page_size - 1) // page_size
    num_pages = batch * pages_per_seq
    block_table = rng.permutation(num_pages).astype(np.int32).reshape(batch, pages_per_seq)
    kv = np.full(batch, kv_len, np.int32)
    q_indptr = np.arange(batch + 1, dtype=np.int32)
    if torch is None:
        q = rng.standard_normal((batch, hq, d)).astype(np.float32)
        k_pool = rng.standard_normal((num_pages, hk, page_size, d)).astype(np.float32)
        return q, k_pool, k_pool.copy(), block_table, kv, q_indptr
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(batch, hq, d, device=device, dtype=dt)
    k_pool = torch.randn(num_pages, hk, page_size, d, device=device, dtype=dt)
    return q, k_pool, torch.randn_like(k_pool), block_table, kv, q_indptr


class Timer:
    def __init__(self, torch, device):
        self.torch, self.cuda = torch, device == "cuda"

    def __call__(self, fn, iters):
        if self.cuda:
            torch = self.torch
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn(iters)
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) * 1e3 / iters  # us per call
        t0 = time.perf_counter()
        fn(iters)
        return (time.perf_counter() - t0) * 1e6 / iters


def measure(args, torch, shape):
    batch, kv_len, hq, hk, d = shape
    q, k_pool, v_pool, bt, kl, qi = make_batch(batch, kv_len, hq, hk, d, 16, args.device, torch)
    out = q.clone() if torch is not None else q.copy()
    stream = pagedattn._arrays.stream_of(q)
    plan = pagedattn.AttentionPlan(q, k_pool, bt, kl, qi)

    def py_oneshot(n):
        for _ in range(n):
            pagedattn.paged_attention(q, k_pool, v_pool, bt, kl, qi, out=out)

    def py_plan_run(n):
        for _ in range(n):
            plan.run(q, k_pool, v_pool, out=out)

    loops = {
        "cpp_oneshot": lambda n: _C._paged_attention_repeated(q, k_pool, v_pool, bt, kl, qi, out,
                                                              n, stream),
        "py_oneshot": py_oneshot,
        "cpp_plan_run": lambda n: plan._plan._run_repeated(q, k_pool, v_pool, out, n, stream),
        "py_plan_run": py_plan_run,
    }
    timer = Timer(torch, args.device)
    for fn in loops.values():  # warm-up: plans, workspaces, caches
        timer(fn, max(10, args.iters // 20))
    samples = {k: [] for k in loops}
    for _ in range(args.rounds):
        for name, fn in loops.items():
            samples[name].append(timer(fn, args.iters))
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "device": args.device, "batch": batch, "kv_len": kv_len, "num_q_heads": hq,
        "num_kv_heads": hk, "head_dim": d, "iters": args.iters, "rounds": args.rounds,
        **{f"{k}_us": round(v, 3) for k, v in med.items()},
        "overhead_oneshot_us": round(med["py_oneshot"] - med["cpp_oneshot"], 3),
        "overhead_plan_run_us": round(med["py_plan_run"] - med["cpp_plan_run"], 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="one JSON object per result")
    args = ap.parse_args()
    torch = None
    try:
        import torch  # noqa: F811
    except ImportError:
        if args.device == "cuda":
            sys.exit("overhead.py: --device cuda needs torch (CUDA tensors and events)")
    if args.device == "cuda" and not (pagedattn.built_with_cuda and torch.cuda.is_available()):
        sys.exit("overhead.py: pagedattn was built without CUDA or no GPU is visible")
    # (batch, kv_len, num_q_heads, num_kv_heads, head_dim). NOTE: on the CPU the kernel itself
    # takes milliseconds at model shapes, which would bury a microsecond of overhead in noise:
    # tiny shapes there.
    shapes = [(1, 1024, 32, 8, 128), (1, 8192, 32, 8, 128), (8, 1024, 32, 8, 128),
              (1, 1024, 8, 8, 64)]
    if args.device == "cpu":
        shapes = [(1, 16, 1, 1, 64), (1, 16, 8, 2, 64)]
    rows = [measure(args, torch, s) for s in shapes]
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    cols = ["batch", "kv_len", "num_q_heads", "num_kv_heads", "head_dim", "cpp_oneshot_us",
            "py_oneshot_us", "overhead_oneshot_us", "cpp_plan_run_us", "py_plan_run_us",
            "overhead_plan_run_us"]
    heads = ["batch", "kv_len", "hq", "hk", "d", "C++ 1-shot", "Py 1-shot", "overhead",
             "C++ run", "Py run", "overhead"]
    print(f"device {args.device}: microseconds per call, median of {args.rounds} rounds of "
          f"{args.iters} calls")
    print("  ".join(f"{h:>10}" for h in heads))
    for r in rows:
        print("  ".join(f"{r[c]:>10}" for c in cols))


if __name__ == "__main__":
    main()
