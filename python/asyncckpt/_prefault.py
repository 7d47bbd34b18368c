"""Reading a checkpoint into newly allocated host memory without paying its page faults in line.

Memory that ``load()`` allocates has no pages yet. The reader pins its destinations before it
reads (io_uring's registered buffers), and the kernel faults every 4 KiB page in on that one
thread, zero-filling each: at 2 GiB that was most of a ``load()`` (issue 32), where a
``restore()`` into tensors that already hold their pages pays none of it. Here the pages are
faulted in ahead of the reader, on threads of their own (``MADV_POPULATE_WRITE``, Linux 5.14,
without the GIL), and the reads go in batches: the reader reads one batch while the next are
faulted in. Nothing here changes what is read or where; without the madvise (another kernel or
system) the reader faults the pages itself, as before.

Transparent huge pages were measured and left out: on a VM whose free memory goes back to the
host (free page reporting), a huge page comes from exactly the memory the host took back, and
faulting 1 GiB of them took 4-5 s against 1.2 s for small pages.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import ctypes.util
import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from . import _core

MADV_POPULATE_WRITE = 23  # linux/mman.h
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# Tensors below this are left to the reader: their pages are few, the madvise call is not free.
MIN_PREFAULT_BYTES = 1 << 20
# Bytes per madvise call: what one fault thread takes at a time.
PIECE_BYTES = 32 << 20
# Bytes of the first read_into call; each later one takes twice the one before. A call has a
# set-up of its own (measured: 16 calls of 128 MiB took 1.1 s more than one of 2 GiB), so the
# number of calls grows with the log of the size, while the first starts early.
BATCH_BYTES = 256 << 20

_lock = threading.Lock()
_madvise: Callable[[int, int, int], int] | None = None
_unavailable = sys.platform != "linux"


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """libc's madvise through ctypes (which drops the GIL for the call), or None off Linux."""
    global _madvise
    with _lock:
        if _unavailable:
            return None
        if _madvise is None:
            libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
            function = libc.madvise
            function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            function.restype = ctypes.c_int
            _madvise = function
        return _madvise


def populate(address: int, nbytes: int) -> bool:
    """Faults in the whole pages of [address, address + nbytes) for writing; False (and no more
    tries in this process) where the kernel lacks MADV_POPULATE_WRITE."""
    global _unavailable
    madvise = _libc_madvise()
    if madvise is None:
        return False
    start = -(-address // _PAGE) * _PAGE  # only pages wholly inside: neighbours are not ours
    end = (address + nbytes) // _PAGE * _PAGE
    if end <= start:
        return True
    if madvise(start, end - start, MADV_POPULATE_WRITE) != 0:
        error = ctypes.get_errno()
        if error in (22, 38):  # EINVAL, ENOSYS: a kernel before 5.14; the reader faults instead
            _unavailable = True
            return False
        # ENOMEM, EFAULT, EINTR...: the reader's own faults report a real shortage.
    return True


def batches(specs: Sequence[_core.TensorSpec]) -> list[list[_core.TensorSpec]]:
    """``specs`` in order, cut into runs of about BATCH_BYTES, then twice, four times that..."""
    out: list[list[_core.TensorSpec]] = [[]]
    size = 0
    limit = BATCH_BYTES
    for spec in specs:
        if out[-1] and size + spec[4] > limit:
            out.append([])
            size = 0
            limit *= 2
        out[-1].append(spec)
        size += spec[4]
    return out


def pieces(specs: Sequence[_core.TensorSpec]) -> list[tuple[int, int]]:
    """(address, bytes) of the host memory of ``specs`` worth faulting in ahead, in order, cut
    into PIECE_BYTES so that several threads share one large tensor and the first read waits
    for little."""
    out: list[tuple[int, int]] = []
    for _, _, _, address, nbytes, cuda in specs:
        if cuda is None and nbytes >= MIN_PREFAULT_BYTES:
            out += _cut(address, nbytes)
    return out


def _cut(address: int, nbytes: int) -> list[tuple[int, int]]:
    """[address, address + nbytes) in pieces of PIECE_BYTES."""
    return [(address + offset, min(PIECE_BYTES, nbytes - offset))
            for offset in range(0, nbytes, PIECE_BYTES)]


def _fault_in(address: int, nbytes: int) -> None:
    populate(address, nbytes)


def fault_threads() -> int:
    """Threads that fault pages in beside the reader: every core but one (the reader's), at
    least one, at most 8."""
    return max(1, min(8, (os.cpu_count() or 1) - 1))


def read_into_new_memory(reader: _core.Reader, specs: Sequence[_core.TensorSpec],
                         boxes: dict[str, tuple[list[int], list[int]]],
                         then: Sequence[tuple[int, int]] = ()) -> None:
    """``reader.read_into(specs, boxes)`` for destinations allocated just now, their page
    faults taken ahead of the reads on other threads. Only for memory no one else sees yet: a
    failure leaves the batches before it read. ``then``: (address, bytes) of new memory the
    caller fills once the reads are done, faulted in too, after the destinations (the threads
    would idle while the last reads run), and by the time this returns.

    The calling thread does not idle while the fault threads work: when it reaches a batch, it
    faults in the pieces of it that no thread has started itself (with the same madvise, which
    measured faster here than the faults the reader takes as it registers its destinations:
    about 0.15 s per 256 MiB against 0.6-0.8 s), waits for those under way, then reads.
    So the first batch is faulted in by this thread while the fault threads go ahead."""
    host = sum(spec[4] for spec in specs if spec[5] is None) + sum(n for _, n in then)
    if host < MIN_PREFAULT_BYTES or _libc_madvise() is None:
        reader.read_into(list(specs), boxes)
        return
    runs = batches(specs)
    with concurrent.futures.ThreadPoolExecutor(fault_threads(),
                                               thread_name_prefix="asyncckpt-fault") as pool:
        faulted = [[(piece, pool.submit(_fault_in, *piece)) for piece in pieces(run)]
                   for run in runs]
        faulted.append([(piece, pool.submit(_fault_in, *piece))
                        for address, nbytes in then
                        for piece in _cut(address, nbytes)])
        runs.append([])  # ``then``'s pieces: nothing to read once they are in
        try:
            for run, own in zip(runs, faulted):
                for piece, future in own:
                    if future.cancel():
                        _fault_in(*piece)
                    else:
                        future.result()
                if run:
                    reader.read_into(run, {spec[0]: boxes[spec[0]] for spec in run
                                           if spec[0] in boxes})
        finally:
            for own in faulted:
                for _, future in own:
                    future.cancel()
