"""Side-by-side figures of bench-quick runs of two builds: python3 compare.py base1 base2 new1 new2
(reads bench-quick-<name>.json beside this file; names starting with "base" are the old build)."""

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KEYS = [("blocked_over_memcpy", "lower"), ("step_p50_over_none", "lower"), ("durable_s", "lower"),
        ("persist_over_limit", "higher"), ("restore_over_limit", "higher"),
        ("rss_over_budget", "lower"), ("loop_lost_s", "lower")]


def load(name):
    with open(os.path.join(HERE, f"bench-quick-{name}.json")) as f:
        return json.load(f)


def figure(run, layout, variant, key):
    try:
        return run["results"]["256 MiB"]["layouts"][layout][variant]["summary"][key]
    except (KeyError, TypeError):
        return None


def main(names):
    runs = {name: load(name) for name in names}
    bases = [n for n in runs if n.startswith("base")]
    news = [n for n in runs if n.startswith("new")]
    print(f"{'layout':6} {'variant':12} {'figure':20} " + " ".join(f"{n:>8}" for n in runs) +
          "   new/base (median)")
    worse = []
    for layout in ("large", "small"):
        for variant in runs[bases[0]]["results"]["256 MiB"]["layouts"][layout]:
            for key, better in KEYS:
                values = {n: figure(runs[n], layout, variant, key) for n in runs}
                if all(v is None for v in values.values()):
                    continue
                base = [values[n] for n in bases if values[n] is not None]
                new = [values[n] for n in news if values[n] is not None]
                ratio = (statistics.median(new) / statistics.median(base)
                         if base and new and statistics.median(base) else None)
                flag = ""
                if ratio is not None and ((better == "lower" and ratio > 1.05) or
                                          (better == "higher" and ratio < 0.95)):
                    flag = " <-- worse"
                    worse.append((layout, variant, key, round(ratio, 3)))
                cells = " ".join(f"{v:8.3f}" if isinstance(v, (int, float)) else f"{'-':>8}"
                                 for v in values.values())
                print(f"{layout:6} {variant:12} {key:20} {cells}" +
                      (f"   {ratio:.3f}{flag}" if ratio else ""))
    print("worse than 5%:", worse)


if __name__ == "__main__":
    main(sys.argv[1:])
