#!/usr/bin/env python3
"""Times torch scaled_dot_product_attention (cuDNN and flash backends) on contiguous K/V at the
shapes of `pagedattn bench attention --device cuda`, and prints comparable lines.

Decode: q [B, Hq, 1, D], K/V [B, Hkv, ctx, D] bf16 (GQA through enable_gqa). Prefill: causal,
q = K/V length. Cold L2 before each timed run, untimed: a memset of twice its size, then a read of
another buffer of that size so that the L2 holds clean lines (as pagedattn's benchmark does; after a
memset alone the write-back of its dirty lines competes with the timed kernel), CUDA events,
warm-up, median of --iters.
    python3 scripts/device/torch_baseline.py [--quick] [--iters 30] [--mode all|decode|prefill]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_us(fn, iters, flush):
    for _ in range(3):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times = []
    for i in range(iters):
        flush[0].fill_(i & 0xFF)
        flush[1].sum()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--mode", choices=["all", "decode", "prefill"], default="all")
    args = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    flush = (torch.empty(2 * props.L2_cache_size, dtype=torch.uint8, device=dev),
             torch.ones(props.L2_cache_size // 2, dtype=torch.int32, device=dev))
    print(f"device={props.name} torch={torch.__version__} cudnn={torch.backends.cudnn.version()}")

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_()
    b = torch.empty_like(a)
    us = time_us(lambda: b.copy_(a), args.iters, flush)
    print(f"kind=copy bytes_moved={2 * n} us={us:.2f} GBps={2 * n / us / 1e3:.0f}")
    del a, b

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    batches = [1, 8] if args.quick else [1, 8, 64]
    contexts = [512, 8192] if args.quick else [512, 2048, 8192, 32768]
    kv_heads = [8] if args.quick else [8, 32]
    dims = [128] if args.quick else [128, 256]
    hq = 32
    for d in dims if args.mode != "prefill" else []:
        for hkv in kv_heads:
            for bsz in batches:
                for ctx in contexts:
                    if ctx >= 32768 and bsz > 8:
                        continue
                    q = torch.randn(bsz, hq, 1, d, dtype=torch.bfloat16, device=dev)
                    k = torch.randn(bsz, hkv, ctx, d, dtype=torch.bfloat16, device=dev)
                    v = torch.randn_like(k)
                    kv_bytes = 2 * k.numel() * k.element_size()
                    line = f"kind=torch_decode batch={bsz} ctx={ctx} hq={hq} hkv={hkv} d={d} kv=bf16"
                    for name, be in backends.items():
                        try:
                            with sdpa_kernel([be]):
                                fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hkv != hq)
                                us = time_us(fn, args.iters, flush)
                            line += f" {name}_us={us:.2f} {name}_GBps={kv_bytes / us / 1e3:.0f}"
                        except Exception as e:  # a backend that refuses the shape
                            line += f" {name}_us=n/a"
                    print(line, flush=True)
                    del q, k, v
    # Prefill: the shapes of `bench attention --mode prefill` (issue grid: GQA 32/8 and 32/32,
    # head dims 64/128/256, lengths 2048-32768).
    prefill = [(b, n, 8, 128) for b in (1, 4) for n in (2048, 8192, 32768)]
    prefill += [(1, 8192, 32, 128), (1, 8192, 8, 64), (1, 8192, 8, 256), (4, 8192, 8, 64),
                (4, 8192, 8, 256)]
    for bsz, length, hkv, d in prefill if args.mode != "decode" else []:
        if args.quick and length > 8192:
            continue
        q = torch.randn(bsz, hq, length, d, dtype=torch.bfloat16, device=dev)
        k = torch.randn(bsz, hkv, length, d, dtype=torch.bfloat16, device=dev)
        v = torch.randn_like(k)
        flops = 4.0 * bsz * hq * d * (length * (length + 1) / 2)
        line = f"kind=torch_prefill batch={bsz} len={length} hq={hq} hkv={hkv} d={d}"
        for name, be in backends.items():
            try:
                with sdpa_kernel([be]):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                    us = time_us(fn, max(3, args.iters // 4), flush)
                line += f" {name}_us={us:.1f} {name}_TFLOPs={flops / us / 1e6:.1f}"
            except Exception:
                line += f" {name}_us=n/a"
        print(line, flush=True)


if __name__ == "__main__":
    main()
