"""Joins scripts/gpu-check's results into one JSON and a markdown table, with the GPU issue's
targets marked met or MISSED.

    python3 benchmarks/gpu/gpu_table.py --bench gpu_bench.json --frameworks frameworks.json \
        --tests tests.json --disk disk.json [--jax jax.json] --machine "..." --out PREFIX
        (writes PREFIX.json/.md)

--jax is benchmarks/jax_compare.py's JSON (its table is the .md beside it) or {"skipped": why}
or {"error": why}.
"""

import argparse
import json
import os


def load(path):
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def fmt(value, unit="s"):
    if value is None:
        return "–"
    return f"{value:.3f} {unit}" if unit else f"{value:.2f}"


def rows(bench, frameworks, disk_read):
    out = []
    for name, m in bench.get("modes", {}).items():
        out.append((f"asyncckpt {name}", m.get("blocked_steady_median_seconds"),
                    m.get("blocked_first_seconds"), m.get("to_durable_median_seconds"),
                    m.get("restore_gbps"), m.get("loop_lost_over_d2h")))
    for name, f in frameworks.items():
        if "error" in f:
            out.append((f"{name} ({f['error'][:60]})", None, None, None, None, None))
            continue
        out.append((name, f.get("blocked_steady_median_seconds"), f.get("blocked_first_seconds"),
                    f.get("to_durable_median_seconds"), f.get("restore_gbps"), None))
    lines = [("| checkpointer | blocked per save (steady) | first save blocked | to durable | "
              "restore into GPU | restore / disk read | loop lost / D2H |"),
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, steady, first, durable, gbps, lost in out:
        ratio = gbps / disk_read if gbps and disk_read else None
        lines.append(f"| {name} | {fmt(steady)} | {fmt(first)} | {fmt(durable)} | "
                     f"{fmt(gbps, 'GB/s')} | {fmt(ratio, '')} | {fmt(lost, '')} |")
    return lines


def targets(bench, frameworks, disk_read):
    modes = bench.get("modes", {})
    so = modes.get("stream_ordered", {})
    checks = []
    if so:
        checks.append(("stream-ordered blocked ≤ 5 ms", so["blocked_steady_median_seconds"] <= 0.005,
                       f"{so['blocked_steady_median_seconds'] * 1e3:.2f} ms"))
        checks.append(("loop time lost ≤ 10% of D2H (stream-ordered, wait before the update)",
                       so["loop_lost_over_d2h"] <= 0.10, f"{so['loop_lost_over_d2h']:.3f}"))
    for name, m in modes.items():
        checks.append((f"{name}: first save ≤ 1.5× steady", m["first_over_steady"] <= 1.5,
                       f"{m['first_over_steady']:.2f}×"))
    torch_load = frameworks.get("torch_save", {}).get("restore_gbps")
    for name, m in modes.items():
        if "restore_gbps" not in m:
            continue
        ok = disk_read and m["restore_gbps"] >= 0.95 * disk_read
        ok = ok and (torch_load is None or m["restore_gbps"] > torch_load)
        checks.append((f"{name}: restore ≥ 0.95 of disk read and above torch.load", bool(ok),
                       (f"{m['restore_gbps']:.2f} GB/s vs disk {disk_read or 0:.2f}, torch.load "
                        f"{torch_load or 0:.2f}")))
    return checks


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--bench", "--frameworks", "--tests", "--train_sim", "--disk", "--jax",
                 "--machine", "--out"):
        parser.add_argument(flag)
    args = parser.parse_args()
    bench, frameworks = load(args.bench), load(args.frameworks)
    tests, disk = load(args.tests), load(args.disk)
    disk_read = disk.get("read_gbps")
    md = [f"# gpu-check on {args.machine}", "",
          (f"State: {bench.get('state_bytes', 0) / 2**30:.1f} GiB fp32 in {bench.get('tensors')} "
           f"GPU tensors on {bench.get('device')}. Limits: "
           f"D2H {fmt(bench.get('d2h_gbps'), 'GB/s')}, "
           f"H2D {fmt(bench.get('h2d_gbps'), 'GB/s')}, disk O_DIRECT write "
           f"{fmt(disk.get('write_gbps'), 'GB/s')} / read {fmt(disk_read, 'GB/s')}; pinning the "
           f"state: one cudaHostAlloc {fmt(bench.get('pinned_alloc_host_alloc_seconds'))}, "
           f"parallel pieces {fmt(bench.get('pinned_alloc_parallel_seconds'))}."), ""]
    md += rows(bench, frameworks, disk_read)
    train_sim = load(args.train_sim)
    md += ["", ("| train-sim --device cuda, 2 GiB | blocked per save median | first / steady | "
            "loop time lost per save / D2H | restore into GPU |"), "|---|---:|---:|---:|---:|"]
    for mode, m in train_sim.items():
        if "error" in m:
            md.append(f"| {mode} | {m['error']} | | | |")
            continue
        exact = "bit-exact" if m.get("gpu_restore_bit_exact") == 1 else "NOT bit-exact"
        md.append(f"| {mode} | {fmt(m.get('blocked_seconds_per_save_median'))} | "
                  f"{fmt(m.get('first_over_steady_blocked'), '')} | "
                  f"{fmt(m.get('loop_lost_per_save_over_d2h'), '')} | "
                  f"{fmt(m.get('gpu_restore_seconds'))}, {exact} |")
    md += ["", "| target | met | measured |", "|---|---|---|"]
    checks = targets(bench, frameworks, disk_read)
    so = train_sim.get("stream_ordered", {})
    if "loop_lost_per_save_over_d2h" in so:
        checks.append(("train-sim --device cuda loop time lost ≤ 10% of D2H (stream-ordered)",
                       so["loop_lost_per_save_over_d2h"] <= 0.10,
                       f"{so['loop_lost_per_save_over_d2h']:.3f}"))
    md += [f"| {name} | {'met' if ok else 'MISSED'} | {value} |" for name, ok, value in checks]
    md += ["", "CUDA tests: " + ", ".join(f"{k} {v}" for k, v in tests.items())]
    jax = load(args.jax)
    if jax:
        md += ["", ("JAX, Orbax's StandardCheckpointer against asyncckpt on the GPUs "
                    "(benchmarks/jax_compare.py --platform gpu):"), ""]
        if "rows" in jax:
            with open(os.path.splitext(args.jax)[0] + ".md") as f:
                md += f.read().rstrip("\n").splitlines()
        else:
            md.append(f"{'skipped' if 'skipped' in jax else 'failed'}: "
                      f"{jax.get('skipped') or jax.get('error')}")
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump({"machine": args.machine, "gpu_bench": bench, "frameworks": frameworks,
                   "tests": tests, "disk": disk, "train_sim": train_sim, "jax_compare": jax,
                   "targets": [{"target": n, "met": ok, "measured": v} for n, ok, v in checks]},
                  f, indent=1)
    print("\n".join(md))


if __name__ == "__main__":
    main()
