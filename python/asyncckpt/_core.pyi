"""Type stubs of asyncckpt._core, the pybind11 module (python/src/module.cc).

Integers are ``int`` and doubles ``float`` where the binding also takes any object with
``__index__``; containers passed in are the ``Sequence`` and ``Mapping`` the binding takes.
tests/python/test_core_stub.py holds this file to the module's own signatures.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import TypeAlias

from typing_extensions import TypedDict

# Stub-only names (no such attribute at run time): the shapes of what the module takes and
# gives, for the package's annotations.

# (name, C++ dtype short name, shape, address, bytes, CUDA ordinal or None)
TensorSpec: TypeAlias = tuple[str, str, Sequence[int], int, int, int | None]
# tensor name -> (global shape, the shard's first index in each global dimension)
ShardBoxes: TypeAlias = Mapping[str, tuple[Sequence[int], Sequence[int]]]

class SaveStatsDict(TypedDict):
    """One save, as Checkpointer.totals() lists it (the C++ SaveStats)."""

    step: int
    path: str
    ok: bool
    error: str | None
    bytes_raw: int
    bytes_stored: int
    chunks_by_codec: dict[str, int]
    final_level: int
    switched_to_raw: bool
    blocked_seconds: float
    seconds_to_durable: float

class ReadStatsDict(TypedDict):
    """Reader.read_stats(): the C++ ReadStats."""

    bytes_read: int
    chunks_read: int

class TotalsDict(TypedDict):
    """Checkpointer.totals(): the C++ SaverTotals."""

    saves_committed: int
    saves_failed: int
    saves_skipped: int
    blocked_seconds_total: float
    blocked_seconds_max: float
    bytes_raw: int
    bytes_stored: int
    staging_high_water_bytes: int
    startup_seconds: float
    stale_temporaries_removed: list[str]
    saves: list[SaveStatsDict]

MIN_CHUNK_BYTES: int
MAX_CHUNK_BYTES: int
RETENTION_SCORE_KEY: str

class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or read (I/O, corruption, a failed background save)."""

class Reader:
    """An open checkpoint (made by open_reader or Checkpointer.open, not constructed)."""

    @property
    def path(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def wall_time(self) -> float: ...
    def metadata(self) -> dict[str, str]: ...
    def tensors(self) -> list[tuple[str, str, list[int], int, int]]:
        """(name, C++ dtype short name, shape, bytes, stored bytes) of every tensor."""
    def read_into(self, specs: Sequence[TensorSpec], boxes: ShardBoxes = {}) -> None: ...
    def read_stats(self) -> ReadStatsDict:
        """Bytes and chunks this reader has read so far."""
    def verify(self) -> list[str]: ...

class SaverOptions:
    """The C++ SaverOptions: every option of CheckpointManager but the directory, the
    schedule's Orbax rule and the save mode."""

    def __init__(self) -> None: ...
    save_steps: int | None
    save_secs: float | None
    max_to_keep: int
    keep_checkpoint_every_n_hours: float
    keep_period: int
    best_mode: str
    compression: str
    compression_level: int
    staging_bytes: int
    on_busy: str
    on_error: str
    basename: str
    chunk_bytes: int
    num_data_files: int
    background_threads: int
    queue_depth: int
    use_o_direct: bool
    force_posix_io: bool
    metadata: dict[str, str]
    allow_fresh_start: bool
    cuda_stream_ordered: bool

class Coordinator:
    """A job's processes: this rank, their number, and their two collectives as callables."""

    def __init__(self, rank: int, size: int, broadcast: Callable[[bytes, int], bytes],
                 all_gather: Callable[[bytes], list[bytes]]) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...

class Checkpointer:
    """The C++ Checkpointer."""

    def __init__(self, directory: str, options: SaverOptions, asynchronous: bool,
                 coordinator: Coordinator | None = None) -> None: ...
    def check_due(self, step: int) -> bool: ...
    def due(self, step: int) -> bool: ...
    def save(self, step: int, specs: Sequence[TensorSpec], metadata: Mapping[str, str],
             boxes: ShardBoxes = {}) -> None: ...
    def prepare(self, specs: Sequence[TensorSpec], reserve_bytes: int = 0,
                boxes: ShardBoxes = {}) -> None: ...
    def prepare_like_latest(self) -> bool:
        """Starts preparing staging sized like the latest checkpoint (one process); False when
        there is none."""
    def maybe_save(self, step: int, specs: Sequence[TensorSpec], metadata: Mapping[str, str],
                   boxes: ShardBoxes = {}) -> bool: ...
    def wait_until_finished(self) -> None: ...
    def wait_for_finished_saves(self, finished: int, timeout_seconds: float) -> bool:
        """Whether `finished` saves in all have finished, waiting up to the timeout (< 0: no
        limit)."""
    def close(self) -> None: ...
    def totals(self) -> TotalsDict: ...
    def all_steps(self) -> list[int]: ...
    def latest_step(self) -> int | None: ...
    def checkpoint_path(self, step: int) -> str: ...
    def damaged(self) -> list[str]: ...
    def open(self, step: int | None) -> Reader: ...
    def quarantine(self, step: int, why: str) -> None: ...

class ResumeDict(TypedDict):
    """find_resume_checkpoints(): the C++ ResumeCheckpoints."""

    basename: str
    steps: list[int]
    latest_path: str
    skipped: list[str]
    state_file_problem: str

def find_resume_checkpoints(directory: str, basename: str = "") -> ResumeDict: ...
def open_reader(path: str, force_posix_io: bool = False) -> Reader: ...
def latest_checkpoint(directory: str) -> str | None: ...
def export_safetensors(checkpoint: str, out_dir: str, select: str, max_shard_bytes: int,
                       keep_names: bool) -> tuple[list[str], int, int]:
    """The tensors of a checkpoint as safetensors files: (files, tensors, bytes)."""
def import_safetensors(input: str, checkpoint_dir: str, step: int, basename: str, prefix: str,
                       compression: str) -> str:
    """A checkpoint made from safetensors files: its path."""
def capture_log(capture: bool) -> None: ...
def take_log_lines() -> tuple[list[tuple[int, str]], int]: ...
def cuda_available() -> bool: ...
def set_cuda_compute_stream(ordinal: int, stream: int | None) -> None: ...
def wait_for_copies_on_stream(ordinal: int, stream: int) -> None: ...
def dtype_size(name: str) -> int: ...
