"""What the benchmarks measure inside one process, in one place: peak RSS (VmHWM after a reset
through /proc/self/clear_refs), a checkpoint's files dropped from the page cache, its bytes on
disk, and an fsync of a file or directory. pytorch_bench, dcp_compare, peer_candidates and
jax_compare use it (scripts/gpu-check packs it beside jax_compare).
"""

from __future__ import annotations

import os


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM, ...), 0 when it has none."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def drop_page_cache(path: str) -> None:
    """Drops the page cache of every file under `path` (or of the file `path`). The files must
    be clean (fsynced): the kernel keeps dirty pages."""
    paths = [path] if os.path.isfile(path) else [
        os.path.join(root, name) for root, _, files in os.walk(path) for name in files]
    for name in paths:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def bytes_on_disk(path: str) -> int:
    """Allocated bytes of every file under `path` (or of the file `path`)."""
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    return sum(os.lstat(os.path.join(root, name)).st_blocks * 512
               for root, _, files in os.walk(path) for name in files)


def fsync_path(path: str) -> None:
    """fsync of a file or directory by name (a directory's fsync makes its entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
