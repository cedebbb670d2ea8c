"""Kernel time by name over a window of whole engine steps of a kernel trace CSV
(scripts/device/kernel_trace.cpp): the STEPS steps before the trace's last one, a step running from
one embedding kernel to the next. For prefill traces: `bench model --decode-steps 1` ends with
the prompt's chunks and one decode step, so STEPS = prompt / chunk selects the prefill.
    python3 kernel_sums.py trace.csv STEPS
"""
import collections
import sys

from trace_csv import read_trace

kern, _ = read_trace(sys.argv[1], 100)
steps = int(sys.argv[2])
embeds = [i for i, k in enumerate(kern) if "embed" in k[2].lower()]
if len(embeds) < steps + 1:
    sys.exit(f"{len(embeds)} embedding kernels: fewer than {steps} + 1 steps")
lo, hi = embeds[-steps - 1], embeds[-1]
win = kern[lo:hi]
span = win[-1][1] - win[0][0]
tot, cnt = collections.Counter(), collections.Counter()
busy, last_end = 0, win[0][0]
for s, e, n in win:
    tot[n] += e - s
    cnt[n] += 1
    busy += max(0, e - max(s, last_end))
    last_end = max(last_end, e)
print(f"{steps} steps, {len(win)} kernels: span {span / 1e6:.3f} ms, GPU busy {busy / 1e6:.3f} ms "
      f"(idle {(span - busy) / 1e6:.3f})")
for n, t in tot.most_common(25):
    print(f"{t / 1e6:9.3f} ms {100 * t / span:5.1f}%  x{cnt[n]:<5d} {n}")
