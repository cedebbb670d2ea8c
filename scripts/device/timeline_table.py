"""Decode steps from a kernel trace CSV (scripts/device/kernel_trace.cpp, or Nsight Systems'
cuda_gpu_trace): each kernel's time past the kernels before it, averaged over the last STEPS steps.

A step is the span from one embedding kernel to the next (the last step, which has no next, is
left out). Each kernel
is charged from the later of its start and the end of all kernels before it, to its end (an
early-launched dependent waits for the kernel ahead), so the charges and the idle gaps add up to
the step.
    python3 timeline_table.py trace.csv [STEPS] [SEQ]
With SEQ, also the step's first SEQ kernels and its last few in launch order, each charged as
above and averaged over the steps (a layer's products apart, which the table by name sums).
"""
import collections
import sys

from trace_csv import read_trace

kern, other = read_trace(sys.argv[1])  # other: host API calls and copies (KERNEL_TRACE_API=1)
embeds = [i for i, k in enumerate(kern) if "embed" in k[2].lower()]
n_steps = min(int(sys.argv[2]) if len(sys.argv) > 2 else 8, len(embeds) - 1)
if n_steps < 1:
    names = collections.Counter(n for _, _, n in kern)
    print(f"fewer than two embedding kernels: no whole step among {len(kern)} kernels; the most "
          "frequent:")
    for n, c in names.most_common(12):
        print(f"{c:7d}  {n}")
    sys.exit(1)
step = kern[embeds[-1 - n_steps]:embeds[-1]]
t0, t1 = step[0][0], kern[embeds[-1]][0]
# Kernels of one stream, in start order: a dependent launched early (programmatic dependent
# launch) starts before the kernel ahead ends but does its work after it, so each kernel is
# charged from the later of its start and the end of everything before it, to its end.
share = collections.defaultdict(float)
count = collections.Counter(n for _, _, n in step)
idle = 0.0
gaps = []
done = t0
charged = []
for s, e, n in step:
    if s > done:
        idle += s - done
        gaps.append(s - done)
    charged.append(max(0, e - max(s, done)))
    share[n] += charged[-1]
    done = max(done, e)
idle += t1 - done
gaps.append(t1 - done)
span = (t1 - t0) / n_steps
print(f"{n_steps} steps: {len(step) / n_steps:.0f} kernels and {span / 1e6:.3f} ms a step (one "
      f"embedding kernel's start to the next's), idle {idle / n_steps / 1e6:.3f} ms a step in "
      f"{len(gaps) / n_steps:.0f} gaps (largest {max(gaps, default=0) / 1e3:.1f} us)")
print(f"{'ms/step':>8} {'%':>5} {'n/step':>6} {'us each':>8}  kernel (its time past the kernels "
      "before it)")
for n, t in sorted(share.items(), key=lambda x: -x[1]):
    c = count[n] / n_steps
    print(f"{t / n_steps / 1e6:8.3f} {100 * t / n_steps / span:5.1f} {c:6.1f} "
          f"{t / n_steps / c / 1e3:8.2f}  {n}")

seq = int(sys.argv[3]) if len(sys.argv) > 3 else 0
per_step = len(step) // n_steps
if seq and per_step * n_steps == len(step):
    print(f"kernels in launch order, us each (mean over {n_steps} steps of {per_step} kernels):")
    for i in list(range(min(seq, per_step))) + list(range(max(seq, per_step - 6), per_step)):
        t = sum(charged[j * per_step + i] for j in range(n_steps)) / n_steps
        print(f"{i:5d} {t / 1e3:8.2f}  {step[i][2]}")

# Between the last two steps: the host's calls and the copies from the end of the step's last
# kernel to the next step's first, in start order (us from that end).
if other:
    last_end = max(e for _, e, _ in step)
    nxt = kern[embeds[-1]][0]
    t_from = max(e for s_, e, n in step if s_ < nxt) if step else last_end
    t_from = min(t_from, step[-1][1])
    print(f"between the last two steps ({(nxt - t_from) / 1e3:.1f} us from the last kernel's end "
          "to the next step's first), host calls and copies:")
    for s_, e, n in sorted(o for o in other if t_from - 20000 <= o[0] <= nxt):
        if n == "api:cudaStreamQuery_v3020" or n.startswith("api:cudaStreamQuery"):
            continue
        print(f"{(s_ - t_from) / 1e3:9.1f} {(e - s_) / 1e3:8.1f}  {n}")
    q = [o for o in other if t_from <= o[0] <= nxt and "StreamQuery" in o[2]]
    print(f"  (and {len(q)} stream queries)")
