#!/usr/bin/env python3
"""asyncckpt beside every checkpointer a user would pick, on the same state, in one run (issue 29).

Run through `scripts/bench --peers` (which builds first); by hand:

    PYTHONPATH=build/python .venv/bin/python benchmarks/peers_bench.py --build build \
        --bench-dir /work/bench-tmp [--sizes 1GiB,4GiB] [--candidates torch.save,orbax,...]

Per state size and layout (a transformer's training state: bfloat16 weights, float32 norms and
AdamW moments; and, at the first size, 10,000 small float32 tensors) it runs every candidate of
benchmarks/peer_candidates.py in its own process, in turn, and measures the machine's limits
(a parallel memcpy with benchmarks/io_limits; fio's O_DIRECT write with fsync and read,
io_uring, 1 MiB, QD 16) before each third of the candidates and after the last: at least 4
samples, interleaved with the candidates; each ratio is taken against the samples' median, and
their spread is printed. A ratio above 1.0 against a limit means the limit moved while the run
went on, and the table says so.

Figures per candidate: blocked per save (÷ one memcpy of the state), time to durable, persist
(state bytes ÷ time to durable) ÷ fio write, loop time lost per save with a paced update
running, cold restore time and state bytes per second ÷ fio read, bytes on disk, peak RSS ÷
state. Each row names the tool each figure came from. A candidate whose package is missing is a
row that says so. Writes <out>/peers.{json,md,png} (peers-custom.* when --sizes or --candidates
narrow the run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_candidates as pc
import run_bench as rb
import sink_bench as sb

HERE = os.path.dirname(os.path.abspath(__file__))
GROUPS = 3  # limits before each third of the candidates and after the last
MEMCPY = "benchmarks/io_limits parallel memcpy"
FIO_WRITE = f"fio O_DIRECT write + fsync (io_uring, 1 MiB, QD {sb.FIO_QD})"
FIO_READ = f"fio O_DIRECT read (io_uring, 1 MiB, QD {sb.FIO_QD})"
OURS = "asyncckpt-"

# figure key, column title, format, whether less is better
FIGURES = [
    ("blocked_s", "blocked s/save (/ memcpy)", ".3f", True),
    ("durable_s", "durable s", ".3f", True),
    ("persist_over_write", "persist / fio write", ".2f", False),
    ("loop_lost_s", "loop lost s/save", ".3f", True),
    ("restore_s", "restore s (cold)", ".3f", True),
    ("restore_over_read", "restore / fio read", ".2f", False),
    ("bytes_on_disk", "on disk MiB", ".0f", True),
    ("rss_over_state", "peak RSS / state", ".2f", True),
]


# ---- measuring --------------------------------------------------------------------------------
def memcpy_rate(args: argparse.Namespace, size: int) -> float | None:
    path = os.path.join(args.bench_dir, "memcpy.json")
    r = rb.run([os.path.join(args.build, "benchmarks", "io_limits"), "--dir", args.bench_dir,
                "--bytes", str(4 * rb.MiB), "--memcpy_bytes", str(size), "--qd", "1",
                "--repeats", "1", "--json", path])
    if r.returncode != 0:
        return None
    with open(path) as f:
        return float(json.load(f)["memcpy_bytes_per_second"])


def limit_sample(args: argparse.Namespace, size: int) -> dict[str, float | None]:
    pair = sb.fio_pair(args.bench_dir, size)
    sample = {"memcpy": memcpy_rate(args, size), "write": pair["write"], "read": pair["read"]}
    rb.log("    limits: " + ", ".join(f"{k} {sb.fmt_mb(v)}" for k, v in sample.items()))
    return sample


def run_candidate(args: argparse.Namespace, name: str, layout: str, size: int,
                  save_every: int) -> dict[str, Any]:
    directory = os.path.join(args.bench_dir, "peer")
    cmd = [sys.executable, os.path.join(HERE, "peer_candidates.py"), "--candidate", name,
           "--layout", layout, "--bytes", str(size), "--dir", directory,
           "--save-every", str(save_every), "--saves", str(args.saves),
           "--step-ms", str(args.step_ms)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    start = time.time()
    try:
        r = subprocess.run(cmd, text=True, capture_output=True, check=False, env=env,
                           timeout=args.candidate_timeout)
        lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
        if r.returncode != 0 or not lines:
            row = {"status": "failed", "reason": f"failed: exit {r.returncode}: "
                   f"{(r.stderr.strip().splitlines() or ['no output'])[-1][:200]}"}
        else:
            row = json.loads(lines[-1])
    except subprocess.TimeoutExpired:
        row = {"status": "failed",
               "reason": f"failed: no result in {args.candidate_timeout:.0f} s"}
    row["candidate"] = name
    row["seconds"] = time.time() - start
    rb.log(f"    {name:20} {row['seconds']:5.1f} s  " + (
        f"blocked {row['blocked_s']:.3f} s, durable {row['durable_s'] or 0:.3f} s, restore "
        f"{row['restore_s']:.3f} s" if row["status"] == "ok" else row["reason"]))
    return row


def measure(args: argparse.Namespace, size: int, layout: str) -> dict[str, Any]:
    rb.log(f"\n== {rb.size_name(size)}, {layout}")
    limits: list[dict[str, float | None]] = [limit_sample(args, size)]
    write = limits[0]["write"] or 1e9
    # A save every 1 s plus twice the disk's time for the state: an asynchronous save is
    # durable before the next is due, as run_bench paces train-sim.
    save_every = max(3, math.ceil((1.0 + 2.0 * size / write) / (args.step_ms / 1000)))
    names = args.candidates
    per_group = math.ceil(len(names) / GROUPS)
    rows = []
    for g in range(0, len(names), per_group):
        for name in names[g:g + per_group]:
            rows.append(run_candidate(args, name, layout, size, save_every))
        limits.append(limit_sample(args, size))
    return {"layout": layout, "save_every": save_every, "limits": limits, "rows": rows}


# ---- the report (pure: recorded inputs in, figures and text out) ------------------------------
def spread(values: list[float | None]) -> dict[str, Any] | None:
    """Median, min, max and (max - min) / median of the samples that were taken."""
    taken = [v for v in values if v]
    if not taken:
        return None
    median = statistics.median(taken)
    return {"median": median, "min": min(taken), "max": max(taken),
            "spread": (max(taken) - min(taken)) / median, "samples": taken}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The limits' medians and every ok row's figures against them."""
    limits = {k: spread([s.get(k) for s in run["limits"]]) for k in ("memcpy", "write", "read")}
    out = {"limits": limits, "rows": []}
    for row in run["rows"]:
        s = {"candidate": row["candidate"], "status": row["status"]}
        if row["status"] != "ok":
            s["reason"] = row["reason"]
            out["rows"].append(s)
            continue
        state = row["state_bytes"]
        s.update(blocked_s=row["blocked_s"], durable_s=row["durable_s"],
                 loop_lost_s=row["loop_lost_s"], restore_s=row["restore_s"],
                 bytes_on_disk=row["bytes_on_disk"] / rb.MiB, sources=row["sources"])
        memcpy = limits["memcpy"]
        s["blocked_over_memcpy"] = (row["blocked_s"] / (state / memcpy["median"])
                                    if memcpy else None)
        s["persist_over_write"] = (state / row["durable_s"] / limits["write"]["median"]
                                   if row["durable_s"] and limits["write"] else None)
        s["restore_over_read"] = (state / row["restore_s"] / limits["read"]["median"]
                                  if limits["read"] else None)
        peak = row.get("peak_rss_bytes")
        # The interpreter's and the framework's own memory taken out: 1.0 holds the state alone.
        s["rss_over_state"] = ((peak - row["rss_before_bytes"] + state) / state
                               if peak else None)
        out["rows"].append(s)
    return out


def best_peer(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Per figure: asyncckpt's best row against the best other row, ours / theirs."""
    ok = [r for r in summary["rows"] if r["status"] == "ok"]
    out = []
    for key, title, _, lower in FIGURES:
        ours = [r for r in ok if r["candidate"].startswith(OURS) and r.get(key) is not None]
        peers = [r for r in ok if not r["candidate"].startswith(OURS) and r.get(key) is not None]
        if not ours or not peers:
            continue
        pick = min if lower else max
        a = pick(ours, key=lambda r: r[key])
        b = pick(peers, key=lambda r: r[key])
        # A loss at or below zero is the reference step's noise: no ratio of it means anything.
        ratio = a[key] / b[key] if a[key] > 0 and b[key] > 0 else None
        wins = a[key] <= b[key] if lower else a[key] >= b[key]
        out.append({"figure": title, "ours": a["candidate"], "peer": b["candidate"],
                    "ratio": ratio, "less_is_better": lower, "peer_wins": not wins})
    return out


def cell(row: dict[str, Any], key: str, spec: str) -> str:
    value = row.get(key)
    if value is None:
        return "-"
    text = format(value, spec)
    if key in ("persist_over_write", "restore_over_read") and value > 1.0:
        text += " (limit moved)"
    if key == "blocked_s" and row.get("blocked_over_memcpy") is not None:
        text += f" ({row['blocked_over_memcpy']:.2f})"
    return text


def sources_text(row: dict[str, Any]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in row["sources"].items())


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# asyncckpt beside its peers, {report['machine']['date']}", "",
             f"Machine: {rb.describe_machine(report['machine'])}.", "",
             f"Command: `{report['command']}`", ""]
    for key, run in report["runs"].items():
        summary = run["summary"]
        tensors = run["rows"][0].get("tensors", "?") if run["rows"] else "?"
        lines += [(f"## {key} ({tensors} tensors, a save every {run['save_every']} steps of "
                   f"{report['step_ms']:.0f} ms, {report['saves']} saves)"), ""]
        lines += ["| candidate | " + " | ".join(t for _, t, _, _ in FIGURES) + " |",
                  "|---|" + "---:|" * len(FIGURES)]
        for row in summary["rows"]:
            if row["status"] != "ok":
                lines.append(f"| {row['candidate']} | {row['reason']} |"
                             + " - |" * (len(FIGURES) - 1))
                continue
            lines.append(f"| {row['candidate']} | "
                         + " | ".join(cell(row, k, spec) for k, _, spec, _ in FIGURES) + " |")
        lines += ["", "| limit | tool | median MB/s | min - max | spread | samples |",
                  "|---|---|---:|---|---:|---:|"]
        for name, tool in (("memcpy", MEMCPY), ("write", FIO_WRITE), ("read", FIO_READ)):
            s = summary["limits"][name]
            lines.append(f"| {name} | {tool} | " + ("- | - | - | 0 |" if not s else
                         f"{s['median'] / 1e6:.0f} | {s['min'] / 1e6:.0f} - {s['max'] / 1e6:.0f}"
                         f" | {s['spread']:.2f} | {len(s['samples'])} |"))
        lines += ["", "| figure | asyncckpt's best | best peer | ours / peer | who wins |",
                  "|---|---|---|---:|---|"]
        for b in run["best_peer"]:
            ratio = "- (one side <= 0: noise)" if b["ratio"] is None else f"{b['ratio']:.2f}"
            lines.append(f"| {b['figure']} | {b['ours']} | {b['peer']} | {ratio} | "
                         f"{b['peer'] if b['peer_wins'] else 'asyncckpt'} |")
        lines += ["", "Sources:", "", "| candidate | where each figure came from |", "|---|---|"]
        for row in summary["rows"]:
            if row["status"] == "ok":
                lines.append(f"| {row['candidate']} | {sources_text(row)} |")
        lines.append("")
    lines.append(NOTES)
    if report.get("picture"):
        lines += [f"![{report['picture']}]({report['picture']})", ""]
    return "\n".join(lines)


NOTES = f"""How to read it:

- Each candidate ran in its own process: the state built, 5 paced steps (an eighth of the
  tensors updated in place, then a sleep to the step time) as the reference, then the saves,
  then a wait until the last was durable, then a restore of the newest checkpoint into fresh
  memory with its files dropped from the page cache.
- **blocked s/save** (÷ one memcpy of the state at the limits' median): median time the loop
  waited in the save call. **durable s**: median time from the call until the save was durable.
- **persist / fio write**: state bytes ÷ time to durable, over the median of {FIO_WRITE};
  **restore / fio read**: state bytes ÷ cold restore time, over the median of {FIO_READ}. The
  limits were sampled before each third of the candidates and after the last. Above 1.0 the
  limit moved while the run went on ("limit moved"): no target is called met from it. A limit's
  spread is (max - min) / median of its samples.
- **loop lost s/save**: the loop's wall time beyond its steps at the reference step time, per
  save: blocked time plus the steps that background work slowed.
- **peak RSS / state**: VmHWM from the first save to the end of the last, less the process's
  RSS before it, plus the state, over the state: 1.00 is no memory beyond the state.
- **ours / peer**: asyncckpt's best row over the best other row for each figure; below 1.0 is
  better for times, bytes and memory, above 1.0 for the ratios to the limits.
"""


def picture(report: dict[str, Any], out_dir: str, stem: str) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        rb.log("peers_bench: no matplotlib: no picture")
        return None
    key = list(report["runs"])[-1] if report["runs"] else None
    if key is None:
        return None
    for k in report["runs"]:  # the largest transformer state
        if "transformer" in k:
            key = k
    rows = [r for r in report["runs"][key]["summary"]["rows"] if r["status"] == "ok"]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (fkey, title, _, lower) in zip(axes.flat, FIGURES):
        names = [r["candidate"] for r in rows if r.get(fkey) is not None]
        values = [r[fkey] for r in rows if r.get(fkey) is not None]
        colors = ["tab:blue" if n.startswith(OURS) else "tab:gray" for n in names]
        ax.barh(names, [max(v, 1e-4) for v in values], color=colors)
        if fkey.endswith("_s"):
            ax.set_xscale("log")
        if fkey in ("persist_over_write", "restore_over_read"):
            ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_title(title + (" (less is better)" if lower else " (more is better)"), fontsize=9)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"asyncckpt (blue) beside its peers, {key}")
    fig.tight_layout()
    name = f"{stem}.png"
    fig.savefig(os.path.join(out_dir, name), dpi=90)
    plt.close(fig)
    return name


# ---- main -------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--bench-dir", required=True)
    p.add_argument("--out", default=os.path.join(HERE, "results", "peers"))
    p.add_argument("--sizes", default="1GiB,4GiB")
    p.add_argument("--layouts", default="transformer,small",
                   help="small runs at the first size only")
    p.add_argument("--candidates", default=",".join(pc.CANDIDATES))
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--step-ms", type=float, default=100)
    p.add_argument("--candidate-timeout", type=float, default=1800,
                   help="seconds one candidate may take before its row says it failed")
    p.add_argument("--command", default=None)
    args = p.parse_args(argv)
    args.candidates = args.candidates.split(",")
    for name in args.candidates:
        if name not in pc.CANDIDATES:
            raise SystemExit(f"peers_bench: unknown candidate '{name}' "
                             f"(one of {', '.join(pc.CANDIDATES)})")
    os.makedirs(args.bench_dir, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    report: dict[str, Any] = {"machine": rb.machine(args.bench_dir),
                              "command": args.command or " ".join(sys.argv),
                              "step_ms": args.step_ms, "saves": args.saves, "runs": {}}
    rb.log(f"asyncckpt beside its peers: {rb.describe_machine(report['machine'])}")
    started = time.time()
    sizes = [rb.parse_bytes(s) for s in args.sizes.split(",")]
    layouts = args.layouts.split(",")
    for i, size in enumerate(sizes):
        for layout in layouts:
            if layout == "small" and i > 0:
                continue
            run = measure(args, size, layout)
            run["summary"] = summarize(run)
            run["best_peer"] = best_peer(run["summary"])
            report["runs"][f"{rb.size_name(size)} {layout}"] = run
    report["seconds"] = time.time() - started
    custom = args.sizes != "1GiB,4GiB" or args.candidates != list(pc.CANDIDATES)
    stem = "peers-custom" if custom else "peers"
    report["picture"] = picture(report, args.out, stem)
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(report, f, indent=1)
    text = markdown(report)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(text + "\n")
    print(text)
    rb.log(f"wrote {args.out}/{stem}.json, .md, .png in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
