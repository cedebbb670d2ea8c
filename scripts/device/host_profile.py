"""Per-function counts of scripts/device/host_sampler.cpp's stacks: the function each sample was
in (self) and the functions on its stack (inclusive), symbolized with addr2line; then, for each
UNDER function named (a substring), the share of its samples in each function it called.
    python3 host_profile.py samples.txt [TOP] [UNDER ...]
"""
import bisect
import collections
import subprocess
import sys

lines = ("\n" + open(sys.argv[1]).read()).split("\n== maps\n")
stacks = [[int(a, 16) for a in l.split()] for l in lines[0].splitlines() if l.strip()]
maps = []  # (start, end, file offset, path)
for l in lines[1].splitlines():
    f = l.split()
    if len(f) >= 6 and "x" in f[1]:
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        maps.append((lo, hi, int(f[2], 16), f[5]))
maps.sort()
starts = [m[0] for m in maps]


def where(a):
    i = bisect.bisect_right(starts, a) - 1
    if i >= 0 and maps[i][0] <= a < maps[i][1]:
        return maps[i][3], a - maps[i][0] + maps[i][2]
    return None, a


want = collections.defaultdict(set)
for s in stacks:
    for k, a in enumerate(s):
        path, off = where(a if k == 0 else a - 1)  # return addresses: the call is just before
        if path:
            want[path].add(off)
names = {}
for path, offs in want.items():
    offs = sorted(offs)
    try:
        out = subprocess.run(["addr2line", "-f", "-C", "-e", path] + [hex(o) for o in offs],
                             capture_output=True, text=True, timeout=300).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        out = []
    short = path.rsplit("/", 1)[-1]
    for i, o in enumerate(offs):
        fn = out[2 * i] if 2 * i < len(out) and out[2 * i] != "??" else f"{short}+{o:#x}"
        plain = "(" in fn and not fn.startswith("(")
        names[(path, o)] = fn.split("(")[0][:100] if plain else fn[:100]

self_c, incl = collections.Counter(), collections.Counter()
named = []
for s in stacks:
    seen = set()
    frames = []
    for k, a in enumerate(s):
        path, off = where(a if k == 0 else a - 1)
        n = names.get((path, off), "?")
        frames.append(n)
        if k == 0:
            self_c[n] += 1
        if n not in seen:
            incl[n] += 1
            seen.add(n)
    named.append(frames)
top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
N = len(stacks)
print(f"{N} samples")
print("== self")
for n, c in self_c.most_common(top):
    print(f"{100 * c / N:6.2f}%  {n}")
print("== inclusive")
for n, c in incl.most_common(top):
    print(f"{100 * c / N:6.2f}%  {n}")
for under in sys.argv[3:]:
    kids, total = collections.Counter(), 0
    for frames in named:
        idx = [i for i, n in enumerate(frames) if under in n]
        if not idx:
            continue
        total += 1
        i = idx[-1]  # the outermost frame of it; its callee is the frame before
        kids[frames[i - 1] if i > 0 else "(self)"] += 1
    print(f"== under {under}: {total} samples ({100 * total / max(N, 1):.2f}% of all)")
    for n, c in kids.most_common(25):
        print(f"{100 * c / max(total, 1):6.2f}%  {n}")
