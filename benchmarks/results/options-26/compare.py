"""Side-by-side figures of bench-quick runs of two builds: python3 compare.py base1 base2 new1 new2
(reads bench-quick-<name>.json beside this file; names starting with "base" are the old build)."""
import json, os, statistics, sys
HERE = os.path.dirname(os.path.abspath(__file__))
runs = {name: json.load(open(os.path.join(HERE, f'bench-quick-{name}.json'))) for name in sys.argv[1:]}
keys = [("blocked_over_memcpy", "lower"), ("step_p50_over_none", "lower"), ("durable_s", "lower"),
        ("persist_over_limit", "higher"), ("restore_over_limit", "higher"), ("rss_over_budget", "lower"),
        ("loop_lost_s", "lower")]
def get(run, layout, variant, key):
    try: return run['results']['256 MiB']['layouts'][layout][variant]['summary'][key]
    except (KeyError, TypeError): return None
bases = [n for n in runs if n.startswith('base')]; news = [n for n in runs if n.startswith('new')]
print(f"{'layout':6} {'variant':12} {'figure':20} " + " ".join(f"{n:>8}" for n in runs) + "   new/base (median)")
worse = []
for layout in ('large', 'small'):
    for variant in runs[bases[0]]['results']['256 MiB']['layouts'][layout]:
        for key, better in keys:
            vals = {n: get(runs[n], layout, variant, key) for n in runs}
            if all(v is None for v in vals.values()): continue
            b = [vals[n] for n in bases if vals[n] is not None]; w = [vals[n] for n in news if vals[n] is not None]
            ratio = statistics.median(w) / statistics.median(b) if b and w and statistics.median(b) else None
            flag = ''
            if ratio is not None and ((better == 'lower' and ratio > 1.05) or (better == 'higher' and ratio < 0.95)): flag = ' <-- worse'; worse.append((layout, variant, key, ratio))
            print(f"{layout:6} {variant:12} {key:20} " + " ".join(f"{v:8.3f}" if isinstance(v, (int, float)) else f"{'-':>8}" for v in vals.values()) + (f"   {ratio:.3f}{flag}" if ratio else ""))
print("worse than 5%:", worse)
