#!/usr/bin/env python3
"""Sharded checkpoints of a job of several processes (issue 11), on this one machine.

Run through scripts/bench-distributed (which builds first); by hand:

    .venv/bin/python benchmarks/distributed_bench.py --build build --bench-dir /work/bench-tmp

For the same total state, it runs `asyncckpt train-sim` as one process (no --shard, the
reference) and under `mpirun -np N ... train-sim --shard` for each N of --ranks, and reports:

  blocked      per rank, the median time a save blocked the training loop, against one memcpy
               of that rank's shard taken just before each save (train-sim's yardstick)
  durable      the whole job's time to durable per save (rank 0's: from its snapshot to the
               commit, which waits for every rank's part), against the raw write limit of the
               disk for the whole state (benchmarks/io_limits: O_DIRECT io_uring, fsync counted)
  restore      the checkpoint of each N restored on another number of ranks (4 -> 2, 2 -> 4,
               ...; page cache dropped when allowed): bytes read and seconds per rank

Raw (--compression none) so bytes written equal the state. Writes
benchmarks/results/bench-distributed.json and .md. Figures are reported, never asserted.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys

MiB = 1 << 20


def log(*args):
    print(*args, flush=True)


def run(cmd, **kwargs):
    """`cmd`'s completed process, its output captured; the caller reads its return code."""
    return subprocess.run(cmd, text=True, capture_output=True, check=False, **kwargs)


def parse_bytes(text):
    units = {"KiB": 1 << 10, "MiB": MiB, "GiB": 1 << 30}
    for suffix, scale in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * scale)
    return int(text)


def mpirun(ranks):
    launcher = shutil.which("mpirun")
    if launcher is None:
        raise SystemExit("distributed_bench: no mpirun (apt-get install openmpi-bin)")
    return [launcher, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
            "-np", str(ranks)]


def drop_caches():
    """True when the page cache could be dropped (root only)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def machine():
    info = {"hostname": platform.node(), "kernel": platform.release(), "cores": os.cpu_count(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "load_average_at_start": os.getloadavg()}
    try:
        with open("/proc/cpuinfo") as f:
            models = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        info["cpu"] = models[0] if models else platform.processor()
    except OSError:
        pass
    git = run(["git", "rev-parse", "--short", "HEAD"], cwd=os.path.dirname(__file__) or ".")
    if git.returncode == 0:
        info["commit"] = git.stdout.strip()
    mpi = run(["mpirun", "--version"])
    if mpi.returncode == 0:
        info["mpi"] = mpi.stdout.splitlines()[0]
    return info


def write_limit(args):
    path = os.path.join(args.bench_dir, "limits.json")
    cmd = [os.path.join(args.build, "benchmarks", "io_limits"), "--dir", args.bench_dir,
           "--bytes", str(args.state), "--memcpy_bytes", str(MiB), "--qd", "1,4,16",
           "--repeats", "3", "--json", path]
    log(f"io_limits: {args.state // MiB} MiB at QD 1,4,16")
    r = run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"distributed_bench: io_limits failed:\n{r.stdout}{r.stderr}")
    with open(path) as f:
        points = json.load(f)["points"]
    best = max(points, key=lambda p: p["write_bytes_per_second"])
    log(f"  write limit {best['write_bytes_per_second'] / MiB:.0f} MiB/s at QD "
        f"{best['queue_depth']}")
    return {"write_bytes_per_second": best["write_bytes_per_second"],
            "queue_depth": best["queue_depth"], "points": points}


def train_sim_flags(args, ckpt_dir, metrics):
    return ["train-sim", f"--checkpoint_dir={ckpt_dir}", f"--model_bytes={args.state}",
            f"--tensors={args.tensors}", f"--steps={args.steps}",
            f"--save_steps={args.save_steps}", f"--step_ms={args.step_ms}",
            f"--chunk_bytes={args.chunk_bytes}",
            "--compression=none", "--max_to_keep=2", "--quiet", f"--metrics_json={metrics}"]


def job(args, ranks, tag, extra=(), ckpt_dir=None):
    """One train-sim run (ranks 0: one process without --shard); its metrics JSON."""
    ckpt_dir = ckpt_dir or os.path.join(args.bench_dir, tag)
    metrics = os.path.join(args.bench_dir, f"{tag}.json")
    cli = os.path.join(args.build, "bin", "asyncckpt")
    cmd = [cli] + train_sim_flags(args, ckpt_dir, metrics) + list(extra)
    if ranks > 0:
        cmd = mpirun(ranks) + cmd + ["--shard"]
    log(f"{tag}: {' '.join(cmd)}")
    r = run(cmd, timeout=args.timeout)
    if r.returncode != 0:
        raise SystemExit(f"distributed_bench: {tag} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    with open(metrics) as f:
        return json.load(f), " ".join(cmd)


def median(values):
    return statistics.median(values) if values else 0.0


def save_figures(metrics, limit, state):
    """The whole job's per-save figures, from rank 0's metrics (committed saves only)."""
    durable = [s["seconds_to_durable"] for s in metrics["saves"] if s["ok"]]
    ideal = state / limit["write_bytes_per_second"]
    return {"saves": len(durable), "durable_median_s": median(durable),
            "durable_max_s": max(durable) if durable else 0.0,
            "raw_write_limit_s": ideal,
            "durable_over_limit": median(durable) / ideal if ideal > 0 else 0.0}


def per_rank(metrics):
    out = []
    for rank in metrics.get("ranks", []):
        memcpy = rank["shard_memcpy_seconds_median"]
        out.append({"rank": rank["rank"], "shard_bytes": rank["shard_bytes"],
                    "blocked_median_s": rank["blocked_seconds_per_save_median"],
                    "blocked_max_s": rank["blocked_seconds_per_save_max"],
                    "shard_memcpy_median_s": memcpy,
                    "blocked_over_memcpy": (rank["blocked_seconds_per_save_median"] / memcpy
                                            if memcpy > 0 else 0.0),
                    "restore_bytes_read": rank["restore_bytes_read"],
                    "restore_seconds": rank["restore_seconds"]})
    return out


def markdown(report):
    a = report["args"]
    lines = [f"# Sharded checkpoints on one machine ({report['machine'].get('cores')} cores)", "",
             f"`{report['command']}`", "",
             (f"{report['machine'].get('cpu', '?')}; {report['machine'].get('mpi', '')}; "
              f"{report['machine']['date']}, commit {report['machine'].get('commit', '?')}"), "",
             (f"State {a['state'] // MiB} MiB ({a['tensors']} tensors x 3 Adam slots, f32), "
              f"{a['steps']} steps, a save every {a['save_steps']}, raw, "
              f"{a['chunk_bytes'] // 1024} KiB chunks. Raw write limit "
              f"{report['limit']['write_bytes_per_second'] / MiB:.0f} MiB/s "
              f"(io_limits, QD {report['limit']['queue_depth']})."), "",
             "## Saves", "",
             ("| job | rank | shard | blocked per save (median) | memcpy of the shard | "
              "blocked / memcpy | job time to durable (median) | raw write limit for the state "
              "| durable / limit |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        s = run["save"]
        ranks = run["ranks"] or [{"rank": "-", "shard_bytes": a["state"],
                                  "blocked_median_s": run["blocked_median_s"],
                                  "shard_memcpy_median_s": run["memcpy_median_s"],
                                  "blocked_over_memcpy": run["blocked_over_memcpy"]}]
        for i, r in enumerate(ranks):
            job_cells = (f"{s['durable_median_s']:.3f} s | {s['raw_write_limit_s']:.3f} s | "
                         f"{s['durable_over_limit']:.2f}") if i == 0 else " | | "
            lines.append(f"| {run['name'] if i == 0 else ''} | {r['rank']} | "
                         f"{r['shard_bytes'] / MiB:.1f} MiB | {r['blocked_median_s'] * 1e3:.1f} ms"
                         f" | {r['shard_memcpy_median_s'] * 1e3:.1f} ms | "
                         f"{r['blocked_over_memcpy']:.2f} | {job_cells} |")
    lines += ["", "## Resharded restore", "",
              "| saved on | restored on | rank | bytes read | share of the checkpoint | seconds |",
              "|---|---|---|---|---|---|"]
    for rs in report["restores"]:
        for i, r in enumerate(rs["ranks"]):
            share = r["restore_bytes_read"] / a["state"] if a["state"] else 0
            lines.append(f"| {rs['saved_on'] if i == 0 else ''} | "
                         f"{rs['restored_on'] if i == 0 else ''} | {r['rank']} | "
                         f"{r['restore_bytes_read'] / MiB:.1f} MiB | {share:.3f} | "
                         f"{r['restore_seconds']:.3f} |")
    lines += ["", f"Page cache dropped before each restore: {report['caches_dropped']}.", ""]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", required=True)
    p.add_argument("--bench-dir", required=True)
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    p.add_argument("--state", default="256MiB", type=parse_bytes)
    p.add_argument("--tensors", default=8, type=int)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--steps", default=20, type=int)
    p.add_argument("--save-steps", default=5, type=int)
    p.add_argument("--step-ms", default=0, type=float)
    # Smaller than train-sim's 4 MiB: a rank restoring a box reads whole chunks, so the chunk
    # size bounds what it reads beyond its share (at most one chunk at each end of a slice).
    p.add_argument("--chunk-bytes", default=1 << 20, type=parse_bytes)
    p.add_argument("--timeout", default=900, type=int)
    p.add_argument("--command", default="benchmarks/distributed_bench.py")
    args = p.parse_args()
    os.makedirs(args.bench_dir, exist_ok=True)
    ranks = [int(r) for r in args.ranks.split(",")]

    report = {"command": args.command, "machine": machine(),
              "args": {"state": args.state, "tensors": args.tensors, "ranks": ranks,
                       "chunk_bytes": args.chunk_bytes,
                       "steps": args.steps, "save_steps": args.save_steps,
                       "step_ms": args.step_ms},
              "limit": write_limit(args), "runs": [], "restores": []}

    for n in [0] + ranks:
        tag = "one-process" if n == 0 else f"np{n}"
        metrics, cmd = job(args, n, tag)
        report["runs"].append({
            "name": "1 process" if n == 0 else f"{n} ranks", "ranks_n": n, "command": cmd,
            "final_state_digest": metrics["final_state_digest"],
            "blocked_median_s": metrics["blocked_seconds_per_save_median"],
            "memcpy_median_s": metrics["state_memcpy_seconds"],
            "blocked_over_memcpy": metrics["blocked_over_memcpy_median"],
            "save": save_figures(metrics, report["limit"], args.state),
            "ranks": per_rank(metrics)})
        log(f"  digest {metrics['final_state_digest']}, job durable median "
            f"{report['runs'][-1]['save']['durable_median_s']:.3f} s")

    digests = {r["final_state_digest"] for r in report["runs"]}
    report["digests_agree"] = len(digests) == 1
    caches = True
    # Each sharded job's checkpoint, restored on every other world size of the run and on 1.
    for saved in ranks:
        for restored in sorted(set([1] + ranks) - {saved}):
            caches = drop_caches() and caches
            tag = f"restore-np{saved}-on-np{restored}"
            metrics, cmd = job(args, restored, tag, ["--saver=none", "--memcpy_yardstick=false"],
                               ckpt_dir=os.path.join(args.bench_dir, f"np{saved}"))
            report["restores"].append({
                "saved_on": saved, "restored_on": restored, "command": cmd,
                "digest_matches": metrics["final_state_digest"] in digests,
                "ranks": per_rank(metrics)})
            log("  bytes read per rank: " +
                " ".join(str(r["restore_bytes_read"]) for r in report["restores"][-1]["ranks"]))
    report["caches_dropped"] = caches
    for n in [0] + ranks:
        shutil.rmtree(os.path.join(args.bench_dir, "one-process" if n == 0 else f"np{n}"),
                      ignore_errors=True)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench-distributed.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = markdown(report)
    with open(os.path.join(args.out, "bench-distributed.md"), "w") as f:
        f.write(md)
    log(md)
    if not report["digests_agree"]:
        log("WARNING: the runs' final digests differ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
