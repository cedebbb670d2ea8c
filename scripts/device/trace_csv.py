"""Reads a kernel trace CSV (scripts/device/kernel_trace.cpp, or Nsight Systems' cuda_gpu_trace)
for timeline_table.py and kernel_sums.py: the kernels as (start, end, short name) in ns, sorted,
and the host API calls and copies (kernel_trace.cpp with KERNEL_TRACE_API=1) as (start, end,
name)."""
import csv


def read_trace(path, name_width=90):
    kern, other = [], []
    for r in csv.DictReader(open(path)):
        name = r.get("Name", "")
        if not name or name.startswith("[CUDA mem"):
            continue
        start = int(float(r["Start (ns)"]))
        end = start + int(float(r["Duration (ns)"]))
        if name.startswith(("api:", "copy:")):
            other.append((start, end, name))
            continue
        name = name.replace("(anonymous namespace)::", "").split("(")[0].removeprefix("void ")
        kern.append((start, end, name.replace("pagedattn::", "").replace("cuda::", "")[:name_width]))
    kern.sort()
    return kern, other
