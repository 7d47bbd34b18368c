#!/usr/bin/env python3
"""Issue 17's targets in one run: the engine at the speed of any sink, each beside its limit.

Run through `scripts/bench --sinks` (which builds first); by hand:

    .venv/bin/python benchmarks/sink_bench.py --build build --bench-dir /work/bench-tmp \
        --shm-dir /dev/shm/asyncckpt-bench [--sizes 1GiB,4GiB]

Per state size (8 float32 tensors unless said otherwise):

  ceiling   benchmarks/engine_ceiling into a null sink (data-file writes dropped), raw and
            shuffle+zstd level 1 (level pinned), under `taskset` on 1 core and on every core
            (background_threads = cores), beside a parallel memcpy of the same bytes on the
            same cores in the same process; twice each, alternating, averaged; with the CPU
            the process got (cores used) and the rate per CPU-second
  tmpfs     train-sim, asynchronous hook, raw, checkpoints on tmpfs, paced (saves spaced so that
            one is durable at half fio's speed before the next is due, --step_ms 100); beside
            fio's buffered write + fsync into the same tmpfs of as many new files as the run
            holds (3: the speed the spacing takes), of one new file and of a preallocated one,
            and each save's memcpy
  unpaced   issue 33's run, the headline: train-sim --step_ms 0 --save_steps 5 --steps 40
            (saves as fast as the update allows, nothing hides a slow sink) on tmpfs and on the
            disk (O_DIRECT) in turn, and fio's buffered write + fsync of new files
            (--fallocate=none; 3, as much new memory as the run's saves take, then one) into the
            same tmpfs while the same update runs (train-sim --saver none): time to durable on
            tmpfs against the disk's, persist against fio's, blocked against memcpy
  disk      train-sim --saver none, then the asynchronous hook (raw, io_uring) on the disk with
            the training update running; beside fio's O_DIRECT write and read of the same
            bytes (io_uring, 1 MiB, QD 16); restore with asyncckpt restore-bench, page cache
            dropped
  small     the same with 10,000 tensors: peak RSS against state + staging + 5%

Each ratio is taken against a limit measured in the same run. Writes
<out>/bench-sinks.{json,md} (bench-sinks-<sizes>.* for other sizes) and prints every target as met or MISSED.
"""

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_bench as rb

FIO_QD = 16
CEILING_REPEATS = 2


def engine_ceiling(args, size, cores):
    out = os.path.join(args.shm_dir, f"ceiling-{cores}.json")
    cpus = ",".join(str(c) for c in range(cores))
    cmd = ["taskset", "-c", cpus, os.path.join(args.build, "benchmarks", "engine_ceiling"),
           "--dir", args.shm_dir, "--bytes", str(size), "--threads", str(cores),
           "--saves", "5", "--codecs", "none,shuffle+zstd", "--level", "1", "--json", out]
    r = rb.run(cmd)
    if r.returncode != 0:
        raise SystemExit(f"sink_bench: engine_ceiling failed:\n{r.stdout}{r.stderr[-2000:]}")
    for line in r.stdout.splitlines():
        rb.log("    " + line)
    with open(out) as f:
        result = json.load(f)
    result["by_codec"] = {c["codec"]: c for c in result["codecs"]}
    return result


def mean_ceiling(taken):
    """engine_ceiling's figures averaged over runs (rates, cores used, memcpy)."""
    out = copy.deepcopy(taken[0])
    out["runs"] = taken
    out["memcpy_bytes_per_second"] = statistics.mean(t["memcpy_bytes_per_second"] for t in taken)
    for codec, c in out["by_codec"].items():
        for key in ("bytes_per_second", "cores_used", "blocked_seconds"):
            c[key] = statistics.mean(t["by_codec"][codec][key] for t in taken)
    return out


def fio_job(directory, size, rw, direct, preallocate=True, files=1):
    """One fio job over `files` fresh files of `size` bytes each in `directory`, written one
    after the other: MB/s as fio reports it, or None.

    fio preallocates a file before it times the writes (fallocate); on tmpfs that allocates and
    zeroes every page outside the timed part, so the timed write only overwrites memory. A
    checkpoint writes new files, which allocate as they are written: `preallocate=False`
    (--fallocate=none) measures that. Several files take as much new memory as several saves
    do ("New memory on this VM" in docs/benchmarks.md, tmpfs unpaced)."""
    target = os.path.join(directory, "fio.dat")
    engine = ["--ioengine=io_uring", f"--iodepth={FIO_QD}"] if direct else ["--ioengine=psync"]
    where = [f"--filename={target}", f"--size={size}"] if files == 1 else [
        f"--directory={directory}", "--filename_format=fio.$filenum.dat", f"--nrfiles={files}",
        f"--filesize={size}", f"--size={files * size}", "--file_service_type=sequential"]
    cmd = ["fio", "--name=limit", f"--rw={rw}", "--bs=1M", f"--direct={1 if direct else 0}",
           "--end_fsync=1", "--output-format=json"] + where + engine + (
               [] if preallocate else ["--fallocate=none"])
    r = rb.run(cmd)
    try:
        if r.returncode != 0:
            return None
        job = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]
        return float(job[rw]["bw_bytes"])
    except (ValueError, KeyError, IndexError):
        return None
    finally:
        if rw == "read" or not direct:
            for name in os.listdir(directory):
                if name.startswith("fio.") and name.endswith(".dat"):
                    os.remove(os.path.join(directory, name))


def fio_pair(directory, size):
    """O_DIRECT write then read of the same file (the read needs the written file)."""
    return {"write": fio_job(directory, size, "write", True),
            "read": fio_job(directory, size, "read", True)}


def run_train_sim(args, size, tensors, variant, save_steps, steps, tag, bench_dir=None):
    a = copy.copy(args)
    if bench_dir:
        a.bench_dir = bench_dir
    return rb.train_sim(a, size, tensors, variant, [], steps, save_steps, tag)


def persist(m):
    saves = [s for s in m.get("saves", []) if s.get("ok") and s["seconds_to_durable"]]
    return statistics.median([s["bytes_raw"] / s["seconds_to_durable"] for s in saves]) \
        if saves else None


def calibrate(args, size, tensors, write_bps, tag, bench_dir=None):
    """save_steps and steps so that a save is durable, at half the sink's speed, before the
    next is due (as run_bench does), plus the none run's metrics."""
    probe = run_train_sim(args, size, tensors, "none", 6, 6, f"{tag}-probe", bench_dir)
    step_s = max(probe["step_ms_p50"], 1) / 1000
    interval = 1.0 + 2.0 * size / max(write_bps, 1)
    save_steps = max(3, int(interval / step_s + 0.999))
    return save_steps, 4 * save_steps


TMPFS_CHECKPOINTS = 3  # the latest two kept, and the one being written


def result_name(args):
    """bench-sinks for the default 1 GiB; other sizes are named, so they do not replace it."""
    name = "bench-sinks" if args.sizes == "1GiB" else "bench-sinks-" + args.sizes.replace(",", "-")
    everything = {"ceiling", "tmpfs", "disk", "small"}
    return name if args.parts == everything else name + "-" + "-".join(sorted(args.parts))


def tmpfs_fits(size):
    """Whether the state, its staging and TMPFS_CHECKPOINTS checkpoints in /dev/shm fit in the
    memory available now, with a quarter of it to spare."""
    with open("/proc/meminfo") as f:
        available = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
    return (2 + TMPFS_CHECKPOINTS) * size <= 0.75 * available


def measure_tmpfs(args, size, out):
    """train-sim with its checkpoints on tmpfs beside fio's buffered write there."""
    fio_footprint = fio_job(args.shm_dir, size, "write", False, preallocate=False,
                            files=TMPFS_CHECKPOINTS)
    fio_shm = fio_job(args.shm_dir, size, "write", False, preallocate=False)
    fio_shm_overwrite = fio_job(args.shm_dir, size, "write", False)
    rb.log(f"    fio buffered write + fsync of {TMPFS_CHECKPOINTS} new files "
           f"{fmt_mb(fio_footprint)}, of one {fmt_mb(fio_shm)} "
           f"(into a preallocated one: {fmt_mb(fio_shm_overwrite)})")
    # Spaced by what the sink gives the run's saves: new memory for TMPFS_CHECKPOINTS of them,
    # which a VM whose host took freed memory back gives far slower than one file's worth.
    save_steps, steps = calibrate(args, size, 8, fio_footprint or fio_shm or 1e9, "shm",
                                  args.shm_dir)
    shm_args = copy.copy(args)
    shm_args.restore_runs = 1
    m = run_train_sim(shm_args, size, 8, "async-uring", save_steps, steps, "shm-async",
                      args.shm_dir)
    out["tmpfs"] = {"fio_write_bps": fio_shm, "fio_overwrite_bps": fio_shm_overwrite,
                    "fio_footprint_bps": fio_footprint,
                    "persist_bps": persist(m),
                    "blocked_over_memcpy": m.get("blocked_over_memcpy_median"),
                    "blocked_s": m.get("blocked_seconds_per_save_median"),
                    "memcpy_s": m.get("state_memcpy_seconds"), "save_steps": save_steps}
    rb.log(f"    paced async raw: blocked {out['tmpfs']['blocked_s']:.3f} s "
           f"({out['tmpfs']['blocked_over_memcpy']:.2f} x memcpy), persist "
           f"{fmt_mb(out['tmpfs']['persist_bps'])}")


UNPACED_SAVE_STEPS = 5  # issue 33's run: a save every 5 unpaced steps
UNPACED_STEPS = 40  # issue 33 named 20; 40 adds the steady state below
# The saves at steps 0, 5 and 10 grow the directory to the max_to_keep (2) + 1 checkpoints it
# holds from then on; from the fourth on, retention drops one per save, and on tmpfs the next save
# writes over its data files (src/engine/spare_files.h). A job spends its life in that steady
# state, so both medians are printed: over every save, and over the saves after these.
UNPACED_WARMUP_SAVES = 3


def unpaced(args):
    """args for the unpaced runs: no simulated accelerator time."""
    a = copy.copy(args)
    a.step_ms = 0
    a.restore_runs = 1
    return a


def resident_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            line = next(x for x in f if x.startswith("VmRSS:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return 0


def fio_beside_update(args, size):
    """fio's buffered write + fsync into tmpfs while train-sim --saver none runs the same unpaced
    update (started first; fio begins once the state is resident and a second of steps has run;
    the update is stopped after fio ends): of TMPFS_CHECKPOINTS new files, as much new memory as
    the unpaced run's saves take, then of one new file. MB/s of each, in that order."""
    ckpt = os.path.join(args.bench_dir, "ckpt-update")
    cmd = [args.cli, "train-sim", f"--model_bytes={size}", "--optimizer=sgd", "--tensors=8",
           "--steps=100000", "--step_ms=0", "--saver=none", f"--checkpoint_dir={ckpt}",
           "--quiet"] + args.train_sim_flags
    update = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while resident_bytes(update.pid) < size and update.poll() is None:
            if time.time() > deadline:
                raise SystemExit("sink_bench: the update never held its state")
            time.sleep(0.1)
        time.sleep(1.0)
        footprint = fio_job(args.shm_dir, size, "write", False, preallocate=False,
                            files=TMPFS_CHECKPOINTS)
        one_file = fio_job(args.shm_dir, size, "write", False, preallocate=False)
        # An update that ended at any point before here has not come back: one check covers both.
        if update.poll() is not None:
            raise SystemExit(f"sink_bench: the update ended early ({' '.join(cmd)})")
        return footprint, one_file
    finally:
        update.terminate()
        update.wait()
        shutil.rmtree(ckpt, ignore_errors=True)


def durable_median(m):
    saves = [s["seconds_to_durable"] for s in m.get("saves", []) if s.get("ok")]
    return statistics.median(saves) if saves else None


def steady(m):
    """train-sim's figures with only the saves after the warm-up (UNPACED_WARMUP_SAVES)."""
    saves = [s for s in m.get("saves", []) if s.get("ok")]
    return {"saves": saves[UNPACED_WARMUP_SAVES:]}


def unpaced_summary(m):
    return {"persist_bps": persist(m), "durable_s": durable_median(m),
            "steady_durable_s": durable_median(steady(m)),
            "steady_persist_bps": persist(steady(m)),
            "blocked_over_memcpy": m.get("blocked_over_memcpy_median"),
            "blocked_s": m.get("blocked_seconds_per_save_median"),
            "memcpy_s": m.get("state_memcpy_seconds"), "step_ms_p50": m.get("step_ms_p50"),
            "saves": [{k: s.get(k) for k in ("step", "blocked_seconds", "seconds_to_durable",
                                              "state_memcpy_seconds")}
                      for s in m.get("saves", [])]}


def measure_unpaced(args, size, out):
    """Issue 33's unpaced run on tmpfs, then on the disk, then fio beside the same update."""
    a = unpaced(args)
    load = os.getloadavg()[0]
    shm = run_train_sim(a, size, 8, "async-uring", UNPACED_SAVE_STEPS, UNPACED_STEPS,
                        "unpaced-shm", args.shm_dir)
    disk = run_train_sim(a, size, 8, "async-uring", UNPACED_SAVE_STEPS, UNPACED_STEPS,
                         "unpaced-disk")
    fio_footprint, fio_update = fio_beside_update(a, size)
    out["unpaced"] = {"tmpfs": unpaced_summary(shm), "disk": unpaced_summary(disk),
                      "fio_write_beside_update_bps": fio_update,
                      "fio_footprint_beside_update_bps": fio_footprint, "load_at_start": load,
                      "command": shm.get("command")}
    t, d = out["unpaced"]["tmpfs"], out["unpaced"]["disk"]
    rb.log(f"    unpaced tmpfs: durable {fmt(t['durable_s'])} s, persist {fmt_mb(t['persist_bps'])}"
           f", blocked {fmt(t['blocked_over_memcpy'])} x memcpy, step p50 "
           f"{fmt(t['step_ms_p50'], '.0f')} ms")
    rb.log(f"    unpaced disk:  durable {fmt(d['durable_s'])} s, persist {fmt_mb(d['persist_bps'])}"
           f", blocked {fmt(d['blocked_over_memcpy'])} x memcpy, step p50 "
           f"{fmt(d['step_ms_p50'], '.0f')} ms")
    rb.log(f"    fio buffered write + fsync beside the update: {TMPFS_CHECKPOINTS} new files "
           f"{fmt_mb(fio_footprint)}, one {fmt_mb(fio_update)}")


def measure_size(args, size):
    out = {"ceiling": {}, "tmpfs": {}, "unpaced": {}, "disk": {}, "small": {}}
    rb.log(f"\n== {rb.size_name(size)}: engine ceiling, null sink")
    # Alternating 1, all, 1, all: the load of a shared machine drifts within minutes, so each
    # side gets the mean of two runs taken in turn.
    runs = {}
    for _ in range(CEILING_REPEATS if "ceiling" in args.parts else 0):
        for cores in sorted({1, os.cpu_count()}):
            runs.setdefault(cores, []).append(engine_ceiling(args, size, cores))
    for cores, taken in runs.items():
        out["ceiling"][cores] = mean_ceiling(taken)

    rb.log(f"== {rb.size_name(size)}: tmpfs ({args.shm_dir})")
    if "tmpfs" not in args.parts:
        rb.log("    not asked for (--parts)")
    elif not tmpfs_fits(size):
        rb.log(f"    skipped: the state, its staging and {TMPFS_CHECKPOINTS} checkpoints in "
               f"/dev/shm would take more than the memory available")
    else:
        measure_tmpfs(args, size, out)
        measure_unpaced(args, size, out)

    for layout, tensors in (("disk", 8), ("small", 10000)):
        if layout not in args.parts:
            continue
        rb.log(f"== {rb.size_name(size)}: disk ({args.bench_dir}), {tensors} tensors")
        limit = fio_pair(args.bench_dir, size)
        rb.log(f"    fio O_DIRECT QD {FIO_QD}: write {fmt_mb(limit['write'])}, "
               f"read {fmt_mb(limit['read'])}")
        save_steps, steps = calibrate(args, size, tensors, limit["write"] or 1e9, layout)
        none = run_train_sim(args, size, tensors, "none", save_steps, steps, f"{layout}-none")
        m = run_train_sim(args, size, tensors, "async-uring", save_steps, steps,
                          f"{layout}-async")
        none_end = run_train_sim(args, size, tensors, "none", save_steps, steps,
                                 f"{layout}-none-end")
        none["step_ms_p50"] = statistics.mean([none["step_ms_p50"], none_end["step_ms_p50"]])
        lim = {"write_limit": limit["write"] or 1, "read_limit": limit["read"] or 1}
        s = rb.summarize(m, lim, none, save_steps * none["step_ms_p50"] / 1000)
        s["fio_write_bps"], s["fio_read_bps"] = limit["write"], limit["read"]
        out[layout] = s
        rb.log(f"    async raw: persist {fmt_mb(s['persist_bps'])} "
               f"({fmt(s['persist_over_limit'])} x fio), step p50 "
               f"{fmt(s.get('step_p50_over_none'), '.3f')} x none, restore "
               f"{fmt_mb(s['restore_bps'])} ({fmt(s['restore_over_limit'])} x fio), RSS "
               f"{fmt(s.get('rss_over_budget'))} x budget")
    return out


def fmt(x, spec=".2f"):
    return "-" if x is None else format(x, spec)


def fmt_mb(x):
    return "-" if not x else f"{x / 1e6:.0f} MB/s"


def per_cpu(codec):
    """MB per CPU-second the process used: the engine's rate with the machine's sharing taken
    out (the cores it was given, not the cores it asked for)."""
    used = codec.get("cores_used") or 0
    return f"{codec['bytes_per_second'] / used / 1e6:.0f} MB/s" if used > 0 else "-"


def targets(results):
    rows = []

    def add(what, value, limit, met, note=""):
        rows.append({"target": what, "value": value, "goal": limit, "met": bool(met),
                     "note": note})

    for size_key, r in results.items():
        cores = sorted(r["ceiling"], key=int)
        for c in cores:
            e = r["ceiling"][c]
            raw = e["by_codec"]["none"]
            zstd = e["by_codec"]["shuffle+zstd"]
            used = (f"cores used {raw['cores_used']:.2f} / {zstd['cores_used']:.2f}; per CPU-second "
                    f"{per_cpu(raw)} / {per_cpu(zstd)}")
            x = raw["bytes_per_second"] / e["memcpy_bytes_per_second"]
            add(f"null sink, raw / parallel memcpy, {c} core(s), {size_key}", f"{x:.2f}",
                ">= 0.50", x >= 0.5, used)
            per_core = zstd["bytes_per_second"] / int(c) / 1e9
            add(f"null sink, shuffle+zstd L1 per core, {c} core(s), {size_key}",
                f"{per_core:.2f} GB/s", ">= 0.40 GB/s", per_core >= 0.4, used)
        if len(cores) > 1:
            one, many = r["ceiling"][cores[0]], r["ceiling"][cores[-1]]
            for codec in ("none", "shuffle+zstd"):
                a = one["by_codec"][codec]["bytes_per_second"]
                b = many["by_codec"][codec]["bytes_per_second"]
                add(f"null sink, {codec}, {cores[-1]} cores / 1 core, {size_key}",
                    f"{b / a:.2f}", ">= 1.70", b / a >= 1.7,
                    f"cores used {one['by_codec'][codec]['cores_used']:.2f} -> "
                    f"{many['by_codec'][codec]['cores_used']:.2f}")
        u = r.get("unpaced") or {}
        ut, ud = u.get("tmpfs") or {}, u.get("disk") or {}
        if ut.get("steady_durable_s") and ud.get("steady_durable_s"):
            x = ut["steady_durable_s"] / ud["steady_durable_s"]
            add(f"tmpfs unpaced, steady state (saves 4 on), time to durable / disk O_DIRECT, "
                f"{size_key}", f"{x:.2f}", "<= 1.00", x <= 1.0,
                f"{ut['steady_durable_s']:.2f} s / {ud['steady_durable_s']:.2f} s (medians)")
        if ut.get("steady_persist_bps") and u.get("fio_write_beside_update_bps"):
            x = ut["steady_persist_bps"] / u["fio_write_beside_update_bps"]
            add(f"tmpfs unpaced, steady state (saves 4 on), persist / fio buffered write + fsync "
                f"of a new file beside the update, {size_key}", f"{x:.2f}", ">= 0.80", x >= 0.8,
                f"{fmt_mb(ut['steady_persist_bps'])} / "
                f"{fmt_mb(u['fio_write_beside_update_bps'])}")
        if ut.get("durable_s") and ud.get("durable_s"):
            x = ut["durable_s"] / ud["durable_s"]
            add(f"tmpfs unpaced, every save, time to durable / disk O_DIRECT unpaced, {size_key}",
                f"{x:.2f}", "<= 1.00", x <= 1.0,
                f"{ut['durable_s']:.2f} s / {ud['durable_s']:.2f} s (medians); step p50 "
                f"{fmt(ut.get('step_ms_p50'), '.0f')} / {fmt(ud.get('step_ms_p50'), '.0f')} ms; "
                f"load {fmt(u.get('load_at_start'), '.1f')}; the first saves take new memory, "
                f"which fio writes at {fmt_mb(u.get('fio_footprint_beside_update_bps'))}")
        if ut.get("persist_bps") and u.get("fio_footprint_beside_update_bps"):
            x = ut["persist_bps"] / u["fio_footprint_beside_update_bps"]
            add(f"tmpfs unpaced, every save, persist / fio buffered write + fsync of "
                f"{TMPFS_CHECKPOINTS} new files beside the update, {size_key}", f"{x:.2f}",
                ">= 0.80", x >= 0.8,
                f"{fmt_mb(ut['persist_bps'])} / {fmt_mb(u['fio_footprint_beside_update_bps'])}; "
                f"of one new file {fmt_mb(u.get('fio_write_beside_update_bps'))}")
        if ut.get("blocked_over_memcpy") is not None:
            add(f"tmpfs unpaced, blocked / memcpy, {size_key}",
                f"{ut['blocked_over_memcpy']:.2f}", "<= 1.20", ut["blocked_over_memcpy"] <= 1.2,
                f"{fmt(ut.get('blocked_s'), '.3f')} s / {fmt(ut.get('memcpy_s'), '.3f')} s")
        t = r["tmpfs"]
        if t.get("blocked_over_memcpy") is not None:
            add(f"tmpfs paced, blocked / memcpy, {size_key}", f"{t['blocked_over_memcpy']:.2f}",
                "<= 1.20", t["blocked_over_memcpy"] <= 1.2)
        if t.get("persist_bps") and t.get("fio_footprint_bps"):
            # The paced run's 4 saves write TMPFS_CHECKPOINTS checkpoints into new memory.
            x = t["persist_bps"] / t["fio_footprint_bps"]
            add(f"tmpfs paced, persist / fio buffered write + fsync of {TMPFS_CHECKPOINTS} new "
                f"files, {size_key}", f"{x:.2f}", ">= 0.80", x >= 0.8,
                f"{fmt_mb(t['persist_bps'])} / {fmt_mb(t['fio_footprint_bps'])}; of one new file "
                f"{fmt_mb(t['fio_write_bps'])}; into a preallocated file "
                f"{fmt_mb(t.get('fio_overwrite_bps'))}")
        d = r["disk"]
        if d.get("persist_over_limit") is not None:
            add(f"disk, update running, persist / fio O_DIRECT write, {size_key}",
                f"{d['persist_over_limit']:.2f}", ">= 0.90", d["persist_over_limit"] >= 0.9,
                f"{fmt_mb(d['persist_bps'])} / {fmt_mb(d['fio_write_bps'])}")
        if d.get("step_p50_over_none") is not None:
            add(f"disk, step p50 / --saver none, {size_key}", f"{d['step_p50_over_none']:.3f}",
                "<= 1.05", d["step_p50_over_none"] <= 1.05)
        if d.get("restore_over_limit") is not None:
            add(f"restore / fio O_DIRECT read, {size_key}", f"{d['restore_over_limit']:.2f}",
                ">= 0.95", d["restore_over_limit"] >= 0.95,
                f"{fmt_mb(d['restore_bps'])} / {fmt_mb(d['fio_read_bps'])}")
        s = r["small"]
        if s.get("rss_over_budget") is not None:
            add(f"10,000 tensors, peak RSS / (state + staging + 5%), {size_key}",
                f"{s['rss_over_budget']:.2f}", "<= 1.00", s["rss_over_budget"] <= 1.0)
    return rows


def fio_pair_text(unpaced_run):
    """fio's MB/s beside the update, the run's footprint of new files / one new file."""
    return (f"{fmt_mb(unpaced_run.get('fio_footprint_beside_update_bps'))} / "
            f"{fmt_mb(unpaced_run.get('fio_write_beside_update_bps'))}")


def markdown(report):
    lines = [f"# asyncckpt bench, the engine at the speed of any sink, {report['machine']['date']}", "",
             f"Machine: {rb.describe_machine(report['machine'])}; tmpfs: {report['shm_dir']}.",
             ("The machine's 2 cores were shared with other builds while this ran: the cores used "
              "column says how much CPU the engine got."), "",
             f"Command: `{report['command']}`", "",
             "| target | value | goal | met | beside |", "|---|---|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {t['goal']} | "
                     f"{'met' if t['met'] else 'MISSED'} | {t['note']} |")
    lines += ["", (f"Unpaced (issue 33's run: --step_ms 0 --save_steps 5 --steps {UNPACED_STEPS} "
               "--max_to_keep 2, tmpfs then the disk with O_DIRECT, medians over the saves, and "
               f"over the saves after the first {UNPACED_WARMUP_SAVES}, which grow the directory to "
               "its steady size; fio's new-file writes into the same tmpfs while train-sim "
               f"--saver none runs the same update: {TMPFS_CHECKPOINTS} files, as much new "
               "memory as those saves take, and one):"), "",
              ("| size | sink | time to durable s | steady state: durable s | persist MB/s | "
               "blocked / memcpy | step p50 ms | per save: durable s (blocked s) | "
               f"fio beside the update, {TMPFS_CHECKPOINTS} new files / one MB/s | load |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for size_key, r in report["results"].items():
        u = r.get("unpaced") or {}
        for sink in ("tmpfs", "disk"):
            x = u.get(sink)
            if not x:
                continue
            per_save = ", ".join(f"{fmt(s['seconds_to_durable'])} ({fmt(s['blocked_seconds'])})"
                                 for s in x["saves"])
            lines.append(f"| {size_key} | {sink} | {fmt(x['durable_s'])} | "
                         f"{fmt(x.get('steady_durable_s'))} | {fmt_mb(x['persist_bps'])} | {fmt(x['blocked_over_memcpy'])} | "
                         f"{fmt(x['step_ms_p50'], '.0f')} | {per_save} | "
                         f"{fio_pair_text(u) if sink == 'tmpfs' else '-'} | "
                         f"{fmt(u.get('load_at_start'), '.1f')} |")
    skipped = [k for k, r in report["results"].items() if not r.get("unpaced")]
    if skipped:
        lines += ["", (f"No tmpfs runs at {', '.join(skipped)}: not asked for, or the state, its "
                       "staging and the checkpoints in /dev/shm would not fit in the memory "
                       "available then (the log says which).")]
    if not any(r["ceiling"] for r in report["results"].values()):
        return "\n".join(lines)
    lines += ["", ("Null-sink ceiling (engine_ceiling: medians of 5 saves after a warm-up, mean of "
               "two runs taken in turn):"), "",
              ("| size | cores | memcpy MB/s | raw MB/s | shuffle+zstd L1 MB/s | stored/raw | "
               "cores used (raw / zstd) | per CPU-second (raw / zstd) |"),
              "|---|---|---|---|---|---|---|---|"]
    for size_key, r in report["results"].items():
        for c, e in sorted(r["ceiling"].items(), key=lambda kv: int(kv[0])):
            raw, z = e["by_codec"]["none"], e["by_codec"]["shuffle+zstd"]
            lines.append(f"| {size_key} | {c} | {e['memcpy_bytes_per_second'] / 1e6:.0f} | "
                         f"{raw['bytes_per_second'] / 1e6:.0f} | {z['bytes_per_second'] / 1e6:.0f}"
                         f" | {z['stored_over_raw']:.3f} | {raw['cores_used']:.2f} / "
                         f"{z['cores_used']:.2f} | {per_cpu(raw)} / {per_cpu(z)} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--bench-dir", required=True, help="checkpoints on the disk")
    p.add_argument("--shm-dir", required=True, help="checkpoints on tmpfs")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                 "results", "sinks"))
    p.add_argument("--sizes", default="1GiB")
    p.add_argument("--step-ms", type=float, default=100)
    p.add_argument("--parts", default="ceiling,tmpfs,disk,small",
                   help="which of ceiling, tmpfs (paced and unpaced), disk, small to run")
    p.add_argument("--command", default=None)
    p.add_argument("train_sim_flags", nargs="*")
    args = p.parse_args()
    args.parts = set(args.parts.split(","))
    args.cli = os.path.join(args.build, "bin", "asyncckpt")
    args.restore_runs = 3
    args.restore_bench = rb.has_restore_bench(args.cli)
    if not shutil.which("fio"):
        raise SystemExit("sink_bench: needs fio (apt-get install fio)")
    for d in (args.bench_dir, args.shm_dir, args.out):
        os.makedirs(d, exist_ok=True)
    report = {"machine": rb.machine(args.bench_dir), "shm_dir": args.shm_dir,
              "command": args.command or " ".join(sys.argv), "results": {}}
    rb.log(f"asyncckpt bench, sinks: {rb.describe_machine(report['machine'])}")
    started = time.time()
    for size in [rb.parse_bytes(s) for s in args.sizes.split(",")]:
        report["results"][rb.size_name(size)] = measure_size(args, size)
    report["targets"] = targets(report["results"])
    report["seconds"] = time.time() - started
    with open(os.path.join(args.out, result_name(args) + ".json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(args.out, result_name(args) + ".md"), "w") as f:
        f.write(markdown(report) + "\n")
    rb.log("\n== targets (reported, not asserted)")
    for t in report["targets"]:
        rb.log(f"  {'met   ' if t['met'] else 'MISSED'}  {t['target']}: {t['value']} "
               f"(goal {t['goal']}) {t['note']}")
    rb.log(f"\nwrote {args.out}/{result_name(args)}.json, .md in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
