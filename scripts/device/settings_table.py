"""Medians per setting of a log that alternates settings ("== round R env SETTING" lines before
each setting's output), for the comparison scripts (prefill-ab.sh, decode-settings.sh)."""
import collections


def medians(path, parse):
    """{key: {setting: [values, in round order]}} of parse(line) -> (key, value) or None."""
    res, setting = collections.OrderedDict(), None
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return res
    for line in lines:
        if line.startswith("== round"):
            setting = line.split(" env ", 1)[1]
            continue
        got = parse(line)
        if got:
            res.setdefault(got[0], collections.OrderedDict()).setdefault(setting, []).append(got[1])
    return res


def print_table(title, res, fmt="%.2f"):
    """Each key: every setting's values by round, then its median over the first setting's."""
    print("==", title, "(per setting: every round, then median / first setting's median)")
    for key, by in res.items():
        first = None
        cells = []
        for setting, xs in by.items():
            med = sorted(xs)[len(xs) // 2]
            first = first or med
            cells.append("%s: %s (%.3f)" % (setting, "/".join(fmt % x for x in xs), med / first))
        print(key, "|", " | ".join(cells))
