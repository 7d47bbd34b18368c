#!/usr/bin/env python3
"""The evidence of issue 9 in one run: asyncckpt's savers beside the machine's limits.

Run through scripts/bench (which builds first); by hand:

    .venv/bin/python benchmarks/run_bench.py --build build --bench-dir /work/bench-tmp [--quick]

In one checkpoint directory's file system it measures, per state size:

  limits       io_limits: plain O_DIRECT io_uring sequential write (fsync counted) and read
               of the state's size at each queue depth, best QD taken; fio at that QD when fio
               is installed (printed beside it); a parallel memcpy on every core
  none         train-sim --saver none: no checkpointing, the step-time reference
  naive        train-sim --saver naive: write + fsync of one file per tensor, one thread
               (fewer saves: 2 in the loop with large tensors, 1 with small ones, where each
               save is one fsync per tensor; left out of --quick with small tensors)
  sync         the synchronous hook (CheckpointSaverHook), raw
  async-posix  the asynchronous hook, POSIX I/O, raw
  async-uring  the asynchronous hook, io_uring, raw (full mode also at queue depths 1, 4, 16)
  async-zstd   the asynchronous hook, io_uring, shuffle+zstd

each with a few large tensors and with about 10,000 small ones (the same bytes). After each run
it restores the newest checkpoint with the page cache dropped (`asyncckpt restore-bench` when
the CLI has it, else benchmarks/restore_read) and sums its bytes on disk.

Writes benchmarks/results/bench-<mode>.json and .md (table, targets, machine) and two PNGs
(step-time timeline with the saves marked, bars per variant), and prints the targets of issue 9
with whether each was met. Targets are reported, never asserted.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

GiB = 1 << 30
MiB = 1 << 20

VARIANTS = {
    # name: (train-sim flags, is one of the library's savers)
    "none": (["--saver=none"], False),
    "naive": (["--saver=naive"], False),
    "sync": (["--saver=sync", "--compression=none"], True),
    "async-posix": (["--saver=async", "--io=posix", "--compression=none"], True),
    "async-uring": (["--saver=async", "--io=uring", "--compression=none"], True),
    "async-zstd": (["--saver=async", "--io=uring", "--compression=shuffle+zstd"], True),
}
LAYOUTS = {"large": 8, "small": 10000}  # parameter tensors (--optimizer sgd: one array each)


def parse_bytes(text):
    m = re.fullmatch(r"([0-9.]+)\s*(KiB|MiB|GiB|k|M|G)?", text)
    if not m:
        raise SystemExit(f"run_bench: bad size '{text}'")
    scale = {"KiB": 1 << 10, "k": 1 << 10, "MiB": MiB, "M": MiB, "GiB": GiB, "G": GiB}
    return int(float(m.group(1)) * scale.get(m.group(2), 1))


def size_name(n):
    return f"{n // GiB} GiB" if n % GiB == 0 else f"{n // MiB} MiB"


def log(*args):
    print(*args, flush=True)


def run(cmd, **kwargs):
    """`cmd`'s completed process, its output captured; the caller reads its return code."""
    return subprocess.run(cmd, text=True, capture_output=True, check=False, **kwargs)


# ---- the machine ------------------------------------------------------------------------------
def machine(bench_dir):
    info = {"hostname": platform.node(), "kernel": platform.release(),
            "cores": os.cpu_count(), "date": datetime.datetime.now().isoformat(timespec="seconds")}
    try:
        with open("/proc/cpuinfo") as f:
            models = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        info["cpu"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu"] = platform.processor()
    try:
        with open("/proc/meminfo") as f:
            mem = dict(l.split(":", 1) for l in f)
        info["memory_bytes"] = int(mem["MemTotal"].split()[0]) * 1024
    except (OSError, KeyError):
        pass
    fm = run(["findmnt", "-n", "-T", bench_dir, "-o", "SOURCE,FSTYPE,OPTIONS"])
    if fm.returncode == 0 and fm.stdout.split():
        source, fstype, options = (fm.stdout.split() + ["", "", ""])[:3]
        info["filesystem"] = {"source": source, "type": fstype, "options": options}
        dev = os.path.basename(source)
        ls = run(["lsblk", "-dnP", "-o", "MODEL,ROTA,SIZE", source])
        if ls.returncode == 0:
            f = dict(re.findall(r'(\w+)="([^"]*)"', ls.stdout))
            info["filesystem"]["device"] = (f"{f.get('MODEL') or 'no model string'}, "
                                            f"{f.get('SIZE', '?')}, "
                                            f"{'rotational' if f.get('ROTA') == '1' else 'SSD'}"
                                            " as the kernel reports it")
        sched = f"/sys/block/{dev}/queue/scheduler"
        if os.path.exists(sched):
            with open(sched) as f:
                info["filesystem"]["scheduler"] = f.read().strip()
    info["load_average_at_start"] = os.getloadavg()
    git = run(["git", "rev-parse", "--short", "HEAD"], cwd=os.path.dirname(__file__) or ".")
    if git.returncode == 0:
        info["commit"] = git.stdout.strip()
    return info


def describe_machine(m):
    fs = m.get("filesystem", {})
    return (f"{m.get('cpu', '?')}, {m['cores']} cores, "
            f"{m.get('memory_bytes', 0) / GiB:.0f} GiB memory; {fs.get('source', '?')} "
            f"({fs.get('type', '?')}, {fs.get('device', '?')}); Linux {m['kernel']}; "
            f"load average at start {m['load_average_at_start'][0]:.1f}")


# ---- the limits -------------------------------------------------------------------------------
def limits(args, size, qds):
    path = os.path.join(args.bench_dir, "limits.json")
    cmd = [os.path.join(args.build, "benchmarks", "io_limits"), "--dir", args.bench_dir,
           "--bytes", str(size), "--memcpy_bytes", str(size), "--qd", ",".join(map(str, qds)),
           "--repeats", "3",
           "--json", path]
    log(f"  io_limits {size_name(size)}, QD {','.join(map(str, qds))}")
    r = run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"run_bench: io_limits failed:\n{r.stdout}{r.stderr}")
    for line in r.stdout.splitlines():
        log("    " + line)
    with open(path) as f:
        out = json.load(f)
    best_w = max(out["points"], key=lambda p: p["write_bytes_per_second"])
    best_r = max(out["points"], key=lambda p: p["read_bytes_per_second"])
    out["write_limit"] = best_w["write_bytes_per_second"]
    out["write_limit_qd"] = best_w["queue_depth"]
    out["read_limit"] = best_r["read_bytes_per_second"]
    out["read_limit_qd"] = best_r["queue_depth"]
    out["fio"] = fio(args, size, best_w["queue_depth"], best_r["queue_depth"])
    return out


def limits_beside(args, size, limit):
    """One write and read at the sweep's best queue depths, taken right after a variant."""
    path = os.path.join(args.bench_dir, "beside.json")
    qds = sorted({limit["write_limit_qd"], limit["read_limit_qd"]})
    r = run([os.path.join(args.build, "benchmarks", "io_limits"), "--dir", args.bench_dir,
             "--bytes", str(size), "--memcpy_bytes", str(MiB), "--qd", ",".join(map(str, qds)),
             "--repeats", "1", "--json", path])
    if r.returncode != 0:
        return {}
    with open(path) as f:
        points = {p["queue_depth"]: p for p in json.load(f)["points"]}
    return {"write": points[limit["write_limit_qd"]]["write_bytes_per_second"],
            "read": points[limit["read_limit_qd"]]["read_bytes_per_second"]}


def fio(args, size, write_qd, read_qd):
    if not shutil.which("fio"):
        log("    fio: not installed")
        return None
    target = os.path.join(args.bench_dir, "fio.dat")
    result = {}
    for rw, qd in (("write", write_qd), ("read", read_qd)):
        cmd = ["fio", "--name=limit", f"--filename={target}", f"--rw={rw}", "--bs=1M",
               "--direct=1", "--ioengine=io_uring", f"--iodepth={qd}", f"--size={size}",
               "--end_fsync=1", "--output-format=json"]
        r = run(cmd)
        if r.returncode != 0:
            log(f"    fio {rw}: failed ({r.stderr.strip()[:200]})")
            continue
        try:
            job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
            result[rw] = {"queue_depth": qd, "bytes_per_second": job[rw]["bw_bytes"]}
            log(f"    fio {rw:5} QD {qd:3}  {job[rw]['bw_bytes'] / 1e6:7.1f} MB/s")
        except (ValueError, KeyError, IndexError):
            log(f"    fio {rw}: unreadable output")
    if os.path.exists(target):
        os.remove(target)
    return result


# ---- one train-sim run ------------------------------------------------------------------------
def has_restore_bench(cli):
    r = run([cli, "restore-bench", "--help"])
    return r.returncode == 0


def du(path):
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            total += st.st_blocks * 512
    return total


def newest_checkpoint(cli, ckpt_dir, variant):
    if variant == "naive":
        dirs = [d for d in os.listdir(ckpt_dir) if re.fullmatch(r"naive-\d+", d)]
        if not dirs:
            return None
        return os.path.join(ckpt_dir, max(dirs, key=lambda d: int(d.split("-")[1])))
    r = run([cli, "latest", ckpt_dir])
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


def restore_bench_rate(stdout):
    """The median read throughput (bytes on disk per second) of `restore-bench --json`'s
    repeats, or None when its output holds none."""
    try:
        doc = json.loads(stdout[stdout.index("{"):])
        rates = [float(r["read_bytes_per_second"]) for r in doc["repeats"]]
    except (ValueError, KeyError, TypeError):
        return None
    return statistics.median(rates) if rates else None


RESTORE_BENCH = "asyncckpt restore-bench"
RESTORE_READ = "benchmarks/restore_read"


def restore(args, path, variant):
    """(median read throughput, the tool that measured every repeat of it) for checkpoint
    `path`: restore-bench where the CLI has it, else (or for naive's files) restore_read. A
    row's repeats all come from one tool: if restore-bench gives no rate, restore_read measures
    the whole row again."""
    reader = os.path.join(args.build, "benchmarks", "restore_read")
    use_cli = variant != "naive" and args.restore_bench
    rates = []
    for _ in range(args.restore_runs):
        if use_cli:
            run([reader, path, "--evict_only"])
            r = run([args.cli, "restore-bench", path, "--json"])
            rate = restore_bench_rate(r.stdout) if r.returncode == 0 else None
            if rate:
                rates.append(rate)
                continue
            log(f"    restore-bench gave no rate ({r.stderr.strip()[-200:]}); restore_read "
                "measures this row")
            use_cli, rates = False, []
        out = os.path.join(args.bench_dir, "restore.json")
        cmd = [reader, path, "--json", out] + (["--naive"] if variant == "naive" else [])
        r = run(cmd)
        if r.returncode != 0:
            log(f"    restore failed: {r.stderr.strip()}")
            return None, RESTORE_READ
        with open(out) as f:
            rates.append(json.load(f)["bytes_per_second"])
    return statistics.median(rates), RESTORE_BENCH if use_cli else RESTORE_READ


def train_sim(args, size, tensors, variant, extra, steps, save_steps, tag):
    ckpt = os.path.join(args.bench_dir, f"ckpt-{tag}")
    metrics = os.path.join(args.bench_dir, f"{tag}.json")
    shutil.rmtree(ckpt, ignore_errors=True)
    flags, _ = VARIANTS[variant]
    cmd = [args.cli, "train-sim", f"--model_bytes={size}", "--optimizer=sgd",
           f"--tensors={tensors}", f"--steps={steps}", f"--save_steps={save_steps}",
           f"--step_ms={args.step_ms}", "--max_to_keep=2", f"--checkpoint_dir={ckpt}",
           f"--metrics_json={metrics}", "--step_series", "--quiet"] + flags + extra
    if variant not in ("none", "naive"):
        cmd.append("--verify")
    cmd += args.train_sim_flags
    start = time.time()
    r = run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"run_bench: train-sim failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
    with open(metrics) as f:
        m = json.load(f)
    m["command"] = " ".join(cmd[1:])
    m["run_seconds"] = time.time() - start
    if variant != "none":
        path = newest_checkpoint(args.cli, ckpt, variant)
        if path:
            m["bytes_on_disk"] = du(path)
            m["restore_bytes_per_second"], m["restore_tool"] = restore(args, path, variant)
    shutil.rmtree(ckpt, ignore_errors=True)
    return m


def percentile_median(values):
    return statistics.median(values) if values else 0.0


def summarize(m, limit, none, interval_s):
    """The figures issue 9 asks for, from one run's metrics."""
    saves = [s for s in m.get("saves", []) if s.get("ok")]
    persist = [s["bytes_raw"] / s["seconds_to_durable"] for s in saves if s["seconds_to_durable"]]
    blocked = percentile_median([s["blocked_seconds"] for s in saves])
    out = {
        "blocked_s": blocked,
        "blocked_over_memcpy": m.get("blocked_over_memcpy_median", 0.0),
        "memcpy_s": m.get("state_memcpy_seconds", 0.0),
        "loop_lost_s": m.get("loop_seconds_lost_per_save", 0.0),
        "step_p50_ms": m["step_ms_p50"],
        "step_p99_ms": m["step_ms_p99"],
        "durable_s": percentile_median([s["seconds_to_durable"] for s in saves]),
        "persist_bps": percentile_median(persist),
        "restore_bps": m.get("restore_bytes_per_second"),
        "bytes_on_disk": m.get("bytes_on_disk", 0),
        "peak_rss": m["peak_rss_bytes"],
        "staging": m.get("staging_high_water_bytes", 0),
        "saves": len(saves),
        "interval_s": interval_s,
    }
    # Against the limits measured just beside this run (at the sweep's best queue depths): on a
    # shared disk the speed drifts by 2x within minutes, as memory bandwidth does for the memcpy.
    beside = m.get("limits_beside", {})
    out["write_limit_bps"] = beside.get("write", limit["write_limit"])
    out["read_limit_bps"] = beside.get("read", limit["read_limit"])
    out["persist_over_limit"] = out["persist_bps"] / out["write_limit_bps"] if saves else None
    out["restore_over_limit"] = (out["restore_bps"] / out["read_limit_bps"]
                                 if out["restore_bps"] else None)
    if none:
        # The same loss against the reference's median step: it also counts steps the
        # background work slowed evenly, which raise the run's own median.
        if m.get("saves_in_loop"):
            out["loop_lost_vs_none_s"] = (m["loop_seconds"] - m["steps_run"] * none["step_ms_p50"]
                                          / 1000) / m["saves_in_loop"]
        out["step_p50_over_none"] = out["step_p50_ms"] / none["step_ms_p50"]
        out["step_p99_over_none"] = out["step_p99_ms"] / none["step_ms_p99"]
        # The process without checkpointing: the state plus what train-sim itself holds.
        base = max(0, none["peak_rss_bytes"] - none["state_bytes"])
        budget = (m["state_bytes"] + out["staging"]) * 1.05
        out["rss_over_budget"] = (m["peak_rss_bytes"] - m.get("memcpy_yardstick_bytes", 0)
                                  - base) / budget
    out["lost_over_blocked"] = out["loop_lost_s"] / blocked if blocked > 0 else None
    return out


# ---- targets ----------------------------------------------------------------------------------
def targets(results):
    """Issue 9's targets: (what, value, goal text, met) per case."""
    rows = []

    def add(what, value, goal, met):
        rows.append({"target": what, "value": value, "goal": goal, "met": bool(met)})

    for size_key, per_size in results.items():
        for layout, runs in per_size["layouts"].items():
            where = f"{size_key} {layout}"
            s = {v: r["summary"] for v, r in runs.items()}
            sweep = sorted((v for v in s if v.startswith("async-uring-qd")),
                           key=lambda v: int(v.split("qd")[1]))
            for v in ["sync", "async-posix", "async-uring"] + sweep:
                if v in s and s[v]["persist_over_limit"] is not None:
                    x = s[v]["persist_over_limit"]
                    add(f"persist / raw write limit, {v}, {where}", f"{x:.2f}", ">= 0.95",
                        x >= 0.95)
            if "async-zstd" in s and "async-uring" in s:
                a, b = s["async-zstd"]["persist_bps"], s["async-uring"]["persist_bps"]
                add(f"persist with shuffle+zstd / raw path, {where}", f"{a / b:.2f}" if b else "-",
                    ">= 1.00", b and a >= b)
            for v in ("sync", "async-posix", "async-uring", "async-zstd"):
                if v in s and s[v]["restore_over_limit"] is not None:
                    x = s[v]["restore_over_limit"]
                    add(f"restore / raw read limit, {v}, {where}", f"{x:.2f}", ">= 0.95",
                        x >= 0.95)
            for v in ("async-posix", "async-uring", "async-zstd"):
                if v in s:
                    x = s[v]["blocked_over_memcpy"]
                    add(f"blocked / memcpy, {v}, {where}", f"{x:.2f}", "<= 1.05", x <= 1.05)
            for v, x in s.items():
                if v == "none" or "step_p50_over_none" not in x:
                    continue
                if x["interval_s"] > x["durable_s"]:
                    r = x["step_p50_over_none"]
                    add(f"step p50 / none, {v}, {where} (interval {x['interval_s']:.1f} s > "
                        f"durable {x['durable_s']:.2f} s)", f"{r:.3f}", "<= 1.01", r <= 1.01)
            for v in ("sync", "async-posix", "async-uring", "async-zstd"):
                if v in s and s[v].get("rss_over_budget") is not None:
                    x = s[v]["rss_over_budget"]
                    add(f"peak RSS / (state + staging + 5%), {v}, {where}", f"{x:.2f}", "<= 1.00",
                        x <= 1.0)
            for v in ("sync", "async-posix", "async-uring", "async-zstd"):
                if v in s and s[v]["lost_over_blocked"] is not None:
                    x = s[v]["lost_over_blocked"]
                    add(f"loop time lost / blocked, {v}, {where}", f"{x:.2f}", "<= 2.00", x <= 2.0)
        layouts = per_size["layouts"]
        if "large" in layouts and "small" in layouts:
            for v in ("sync", "async-posix", "async-uring", "async-zstd"):
                if v in layouts["large"] and v in layouts["small"]:
                    big = layouts["large"][v]["summary"]["durable_s"]
                    small = layouts["small"][v]["summary"]["durable_s"]
                    if big > 0:
                        add(f"time to durable, ~10k small / few large tensors, {v}, {size_key}",
                            f"{small / big:.2f}", "<= 1.10", small / big <= 1.10)
    return rows


# ---- report -----------------------------------------------------------------------------------
def fmt(x, spec, suffix=""):
    return "-" if x is None else format(x, spec) + suffix


def restore_tools(results):
    """{tool: [rows it measured]} over every row of `results`: the source of each restore
    figure, as the table names it."""
    tools = {}
    for size_key, per_size in results.items():
        for layout, runs in per_size["layouts"].items():
            for variant, r in runs.items():
                tool = r["metrics"].get("restore_tool")
                if tool:
                    tools.setdefault(tool, []).append(f"{size_key} {layout} {variant}")
    return tools


def describe_restore_tools(tools):
    """One sentence naming what measured the restore column."""
    if len(tools) == 1:
        return f"Restore measured with `{next(iter(tools))}` in every row."
    return "Restore measured with " + "; ".join(
        f"`{tool}` in {', '.join(rows)}" for tool, rows in tools.items()) + "."


def markdown(report):
    lines = []
    mode = report["mode"]
    lines.append(f"# asyncckpt bench ({mode} mode), {report['machine']['date']}")
    lines.append("")
    lines.append(f"Machine: {describe_machine(report['machine'])}.")
    lines.append("")
    lines.append(f"Command: `{report['command']}`")
    lines.append("")
    lines.append(describe_restore_tools(report.get("restore_tool", {})))
    lines.append("")
    for size_key, per_size in report["results"].items():
        lim = per_size["limits"]
        fio_text = ""
        if lim.get("fio"):
            parts = [f"{rw} {v['bytes_per_second'] / 1e6:.0f} MB/s at QD {v['queue_depth']}"
                     for rw, v in lim["fio"].items()]
            fio_text = "; fio: " + ", ".join(parts)
        qd_text = ", ".join(f"QD{p['queue_depth']} {p['write_bytes_per_second'] / 1e6:.0f}/"
                            f"{p['read_bytes_per_second'] / 1e6:.0f}" for p in lim["points"])
        lines.append(f"## {size_key} of state")
        lines.append("")
        lines.append(
            f"Limits (medians of {lim.get('repeats', 1)} runs per queue depth): O_DIRECT io_uring write {lim['write_limit'] / 1e6:.0f} MB/s (QD "
            f"{lim['write_limit_qd']}, fsync included), read {lim['read_limit'] / 1e6:.0f} MB/s "
            f"(QD {lim['read_limit_qd']}){fio_text}; parallel memcpy "
            f"{lim['memcpy_bytes_per_second'] / 1e9:.1f} GB/s on {lim['memcpy_threads']} threads. "
            f"Write/read MB/s by queue depth: {qd_text}.")
        lines.append("")
        header = ["tensors", "variant", "blocked s/save", "blocked / memcpy", "loop lost s/save",
                  "loop lost vs none s/save",
                  "step p50 ms (/ none)", "step p99 ms (/ none)", "durable s",
                  "persist MB/s (/ write limit beside)", "restore MB/s (/ read limit beside)",
                  "limits beside: write / read MB/s", "on disk MiB",
                  "peak RSS MiB (/ budget)"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 2)) + "|")
        for runs in per_size["layouts"].values():
            for variant, r in runs.items():
                s = r["summary"]
                none = variant == "none"
                lines.append("| " + " | ".join([
                    f"{r['metrics']['tensors']}",
                    variant,
                    "-" if none else f"{s['blocked_s']:.3f}",
                    "-" if none or not s["blocked_over_memcpy"] else
                    f"{s['blocked_over_memcpy']:.2f}",
                    "-" if none else f"{s['loop_lost_s']:.3f}",
                    fmt(s.get("loop_lost_vs_none_s"), ".3f"),
                    f"{s['step_p50_ms']:.0f}" + ("" if none else
                                                 f" ({s.get('step_p50_over_none', 0):.3f})"),
                    f"{s['step_p99_ms']:.0f}" + ("" if none else
                                                 f" ({s.get('step_p99_over_none', 0):.2f})"),
                    "-" if none else f"{s['durable_s']:.3f}",
                    "-" if none else f"{s['persist_bps'] / 1e6:.0f} "
                    f"({fmt(s['persist_over_limit'], '.2f')})",
                    "-" if none or s["restore_bps"] is None else
                    f"{s['restore_bps'] / 1e6:.0f} ({fmt(s['restore_over_limit'], '.2f')})",
                    "-" if none else
                    f"{s['write_limit_bps'] / 1e6:.0f} / {s['read_limit_bps'] / 1e6:.0f}",
                    "-" if none else f"{s['bytes_on_disk'] / MiB:.0f}",
                    f"{s['peak_rss'] / MiB:.0f}" + ("" if none else
                                                    f" ({fmt(s.get('rss_over_budget'), '.2f')})"),
                ]) + " |")
        lines.append("")
    lines.append("## Targets (issue 9; reported, not asserted)")
    lines.append("")
    lines.append("| target | value | goal | met |")
    lines.append("|---|---:|---:|---|")
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {t['goal']} | "
                     f"{'yes' if t['met'] else '**MISSED**'} |")
    lines.append("")
    lines.append(NOTES)
    for name in report.get("pictures", []):
        lines.append(f"![{name}]({name})")
        lines.append("")
    return "\n".join(lines)


NOTES = """How to read it:

- **blocked s/save**: median time a save held the training thread; **blocked / memcpy**: each
  save's blocked time over one plain parallel memcpy of the state timed just before it (median).
- **loop lost s/save**: the training loop's wall time beyond its steps at their median step
  time, per save: blocked time plus the steps the background work slowed beyond the median
  (issue 9's definition, used by its target); **vs none**: the same beyond the `none` run's
  median, which also counts a slowdown of every step (that raises the run's own median).
- **step p50 / p99 (/ none)**: over every step of the run, against `--saver none` (the mean
  of two `none` runs, one before the variants and one after, as the machine's load drifts).
- **durable s**: median time from the start of a save until it is durable and committed.
- **persist MB/s**: median of raw bytes over time to durable per save, against an O_DIRECT
  io_uring write of the same bytes (fsync included) at the sweep's best queue depth, taken
  right after the variant ran (the disk is shared; its speed drifts within minutes);
  **restore MB/s**: raw bytes of the newest checkpoint read back into host memory with its
  files dropped from the page cache, against an O_DIRECT read at the best depth, taken beside.
- **peak RSS (/ budget)**: VmHWM of the run; the ratio takes out train-sim's own memcpy
  yardstick copy and what the `none` run holds beyond its state, and holds the rest against
  (state + staging high water) × 1.05.
- naive: one thread writes and fsyncs one file per tensor on the training thread (what a
  `numpy.save` / `torch.save` loop gets); its blocked time is its whole save.
"""


def pictures(report, out_dir, stem):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("run_bench: no matplotlib (apt-get install python3-matplotlib): no pictures")
        return []
    names = []
    size_key = list(report["results"])[-1]
    per_size = report["results"][size_key]
    layout = "large" if "large" in per_size["layouts"] else next(iter(per_size["layouts"]))
    runs = per_size["layouts"][layout]
    # Timeline: every step's time, saves marked.
    fig, ax = plt.subplots(figsize=(11, 5))
    for variant, r in runs.items():
        series = r["metrics"].get("step_series")
        if not series:
            continue
        line, = ax.plot(series["step"], series["ms"], label=variant, linewidth=1)
        saved = [(st, ms) for st, ms, sv in zip(series["step"], series["ms"], series["saved"])
                 if sv]
        if saved:
            ax.scatter([p[0] for p in saved], [p[1] for p in saved], marker="v", s=40,
                       color=line.get_color(), zorder=3)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms, log scale)")
    ax.set_title(f"Step time, {size_key} of state, {layout} tensors "
                 f"({report['mode']} mode); triangles: steps that saved")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    name = f"{stem}-timeline.png"
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=100)
    plt.close(fig)
    names.append(name)
    # Bars per variant: seconds per save, and fractions of the limits.
    variants = [v for v in runs if v != "none"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    width = 0.27
    xs = range(len(variants))
    for i, (key, label) in enumerate((("blocked_s", "blocked s/save"),
                                      ("loop_lost_s", "loop lost s/save"),
                                      ("durable_s", "time to durable s"))):
        ax1.bar([x + (i - 1) * width for x in xs],
                [max(runs[v]["summary"][key], 1e-4) for v in variants], width, label=label)
    ax1.set_yscale("log")
    ax1.set_xticks(list(xs))
    ax1.set_xticklabels(variants, rotation=20)
    ax1.set_ylabel("seconds (log scale)")
    ax1.set_title(f"Per save, {size_key}, {layout} tensors")
    ax1.legend(fontsize=8)
    for i, (key, label) in enumerate((("persist_over_limit", "persist / write limit"),
                                      ("restore_over_limit", "restore / read limit"))):
        ax2.bar([x + (i - 0.5) * width for x in xs],
                [runs[v]["summary"][key] or 0 for v in variants], width, label=label)
    ax2.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="target 0.95")
    ax2.set_xticks(list(xs))
    ax2.set_xticklabels(variants, rotation=20)
    ax2.set_ylabel("fraction of the machine's limit")
    ax2.set_title("Throughput against the limits")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    name = f"{stem}-bars.png"
    fig.savefig(os.path.join(out_dir, name), dpi=100)
    plt.close(fig)
    names.append(name)
    return names


# ---- main -------------------------------------------------------------------------------------
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--cli", default=None, help="default: <build>/bin/asyncckpt")
    p.add_argument("--bench-dir", required=True, help="where checkpoints go (removed after each)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results"))
    p.add_argument("--quick", action="store_true",
                   help="256 MiB, limits at QD 1,4,16,64, no saver QD sweep (a few minutes)")
    p.add_argument("--sizes", default=None, help="comma-separated, default 1GiB,4GiB")
    p.add_argument("--layouts", default="large,small")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--step-ms", type=float, default=100)
    p.add_argument("--restore-runs", type=int, default=None)
    p.add_argument("--command", default=None, help="the command line to record")
    p.add_argument("train_sim_flags", nargs="*", help="extra train-sim flags, after --")
    args = p.parse_args()
    args.cli = args.cli or os.path.join(args.build, "bin", "asyncckpt")
    mode = "quick" if args.quick else "full"
    sizes = [parse_bytes(s) for s in (args.sizes or ("256MiB" if args.quick else
                                                     "1GiB,4GiB")).split(",")]
    limit_qds = [1, 4, 16, 64] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    saver_qds = [] if args.quick else [1, 4, 16]
    args.restore_runs = args.restore_runs or 3
    layouts = args.layouts.split(",")
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"run_bench: unknown variant '{v}' (one of {', '.join(VARIANTS)})")
    os.makedirs(args.bench_dir, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    args.restore_bench = has_restore_bench(args.cli)
    report = {"mode": mode, "machine": machine(args.bench_dir),
              "command": args.command or " ".join(sys.argv), "results": {}}
    log(f"asyncckpt bench, {mode} mode: {describe_machine(report['machine'])}")
    log(f"checkpoints under {args.bench_dir}; restore measured with "
        f"{RESTORE_BENCH if args.restore_bench else RESTORE_READ}")
    started = time.time()
    for size in sizes:
        size_key = size_name(size)
        log(f"\n== {size_key} of state")
        per_size = {"limits": limits(args, size, limit_qds), "layouts": {}}
        report["results"][size_key] = per_size
        for layout in layouts:
            tensors = LAYOUTS[layout]
            # Calibrate: the step time without checkpointing sets a save interval long enough
            # for a save to become durable at about half the disk's speed before the next.
            probe = train_sim(args, size, tensors, "none", [], 6, 6, f"{layout}-probe")
            step_s = max(probe["step_ms_p50"], 1) / 1000
            interval = 1.0 + 2.0 * size / per_size["limits"]["write_limit"]
            save_steps = max(3, math.ceil(interval / step_s))
            steps = 4 * save_steps
            log(f"  {layout}: {tensors} tensors, step {step_s * 1000:.0f} ms, save every "
                f"{save_steps} steps, {steps} steps")
            runs = {}
            todo = [(v, []) for v in variants]
            if "async-uring" in variants and layout == "large":
                # The depth sweep is about the write stage; with small tensors the packed
                # writes look the same to the disk, and the sweep would add a quarter to a run.
                todo += [(f"async-uring-qd{q}", [f"--queue_depth={q}"]) for q in saver_qds]
            none = None
            if args.quick and layout == "small":
                todo = [t for t in todo if t[0] != "naive"]
            if "none" in variants:
                # The reference brackets the others: on a shared machine the load drifts
                # within minutes, so none runs first and last and the two are averaged.
                todo.append(("none-end", []))
            for variant, extra in todo:
                base = variant.split("-qd")[0] if "-qd" in variant else variant
                base = "none" if variant == "none-end" else base
                run_steps = steps
                if variant == "naive":  # a second or more per save: fewer of them
                    run_steps = save_steps * (1 if layout == "small" else 2)
                t0 = time.time()
                m = train_sim(args, size, tensors, base, extra, run_steps, save_steps,
                              f"{layout}-{variant}")
                if base != "none":
                    m["limits_beside"] = limits_beside(args, size, per_size["limits"])
                if variant == "none-end":
                    none["step_ms_p50_runs"] = [none["step_ms_p50"], m["step_ms_p50"]]
                    none["step_ms_p99_runs"] = [none["step_ms_p99"], m["step_ms_p99"]]
                    log(f"    {variant:18} {time.time() - t0:5.1f} s  step p50 "
                        f"{m['step_ms_p50']:.0f} ms")
                    continue
                if variant == "none":
                    none = m
                runs[variant] = {"metrics": m}
                log(f"    {variant:18} {time.time() - t0:5.1f} s  step p50 {m['step_ms_p50']:.0f} ms"
                    + ("" if variant == "none" else
                       f"  blocked {m['blocked_seconds_per_save_median']:.3f} s  durable "
                       f"{m['seconds_to_durable_median']:.3f} s  write/read limit beside "
                       f"{m['limits_beside'].get('write', 0) / 1e6:.0f}/"
                       f"{m['limits_beside'].get('read', 0) / 1e6:.0f} MB/s  restore "
                       f"{fmt(m.get('restore_bytes_per_second') and m['restore_bytes_per_second'] / 1e6, '.0f')} MB/s"))
            if none and "step_ms_p50_runs" in none:
                none["step_ms_p50"] = statistics.mean(none["step_ms_p50_runs"])
                none["step_ms_p99"] = statistics.mean(none["step_ms_p99_runs"])
            for variant, r in runs.items():
                r["summary"] = summarize(r["metrics"], per_size["limits"],
                                         none if variant != "none" else None,
                                         save_steps * (none or r["metrics"])["step_ms_p50"] / 1000)
                if variant == "none":
                    r["summary"]["step_p50_ms"] = none["step_ms_p50"]
                    r["summary"]["step_p99_ms"] = none["step_ms_p99"]
            per_size["layouts"][layout] = runs
    report["restore_tool"] = restore_tools(report["results"])
    report["targets"] = targets(report["results"])
    report["seconds"] = time.time() - started
    # Only the default matrices replace the committed results; any other run is "custom".
    custom = args.sizes or args.layouts != "large,small" or args.variants != ",".join(VARIANTS)
    stem = "bench-custom" if custom else f"bench-{mode}"
    report["pictures"] = pictures(report, args.out, stem)
    md = markdown(report)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(report, f, indent=1)
    log("\n== targets (issue 9; reported, not asserted)")
    for t in report["targets"]:
        log(f"  {'met   ' if t['met'] else 'MISSED'}  {t['target']}: {t['value']} (goal {t['goal']})")
    log(f"\nwrote {args.out}/{stem}.json, {stem}.md"
        + "".join(f", {n}" for n in report["pictures"]) + f" in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
