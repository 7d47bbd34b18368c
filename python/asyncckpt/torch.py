"""asyncckpt as torch.distributed.checkpoint's (DCP's) storage and stager.

    import torch.distributed.checkpoint as dcp
    import asyncckpt.torch
    dcp.save(state_dict, storage_writer=asyncckpt.torch.StorageWriter("/ckpt"))
    dcp.load(state_dict, storage_reader=asyncckpt.torch.StorageReader("/ckpt"))
    dcp.async_save(state_dict, storage_writer=asyncckpt.torch.StorageWriter("/ckpt"),
                   async_stager=asyncckpt.torch.Stager())

DCP plans (shards FSDP2 and DTensor state, dedups replicas, reshards on load); asyncckpt writes
and reads. Each ``dcp.save`` is one step of the checkpoint directory ``path`` (the next after its
latest, or ``step=``): every rank's items go through the C++ engine (io_uring, zstd where it
pays, an XXH3 checksum per chunk) into the step's shared temporary directory, and rank 0 makes
the checkpoint visible, atomically, once every rank's part is durable; a crash at any moment
leaves the checkpoints before it as they were and nothing that looks like a checkpoint but is
not one. ``asyncckpt inspect`` and ``asyncckpt verify`` read the result. The reader verifies
every chunk it reads: a damaged byte makes ``dcp.load`` raise, naming the file and the tensor.
``StorageReader`` also reads checkpoints that ``CheckpointManager`` wrote, so ``dcp.load`` gets
a model out of any of them.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import io
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader as _DcpStorageReader
from torch.distributed.checkpoint.storage import StorageWriter as _DcpStorageWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _coordination, _core, _dtypes, _logging, _streams, _tree
from .manager import _saver_options

StrPath = Union[str, "os.PathLike[str]"]

__all__ = ["Stager", "StorageReader", "StorageWriter"]

# The DCP description of a checkpoint StorageWriter wrote, in its metadata (JSON, in pieces the
# format accepts): every item's kind, dtype, global size, and DCP's planner_data.
_DCP_KEY_PREFIX = "asyncckpt.torch.dcp."
_PIECE_CHARS = 512 * 1024


class StorageWriter(_DcpStorageWriter):
    """DCP's StorageWriter over asyncckpt: each ``dcp.save`` writes one step of ``path``.

    ``step``: the step to write (default: one past the directory's latest, 0 when it has none).
    ``process_group``: the ranks that save (default: torch.distributed's default group).
    ``options``: CheckpointManager's options (compression, chunk_bytes, queue_depth, ...;
    ``max_to_keep`` defaults to 0 here: DCP users keep what they saved).
    """

    def __init__(self, path: StrPath, *, step: int | None = None, process_group: Any = None,
                 **options: Any) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self._step = step
        self._group = process_group
        # save() ignores the schedule, but the C++ options need one.
        self._saver_options = _saver_options({"max_to_keep": 0, "save_steps": 1, **options},
                                             "StorageWriter", ("step", "process_group"))
        self._is_coordinator = True

    def reset(self, checkpoint_id: StrPath | None = None) -> None:
        """A new save; ``checkpoint_id`` (when given) is the checkpoint directory."""
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Records whether this rank is DCP's coordinator."""
        self._is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Nothing to add: every item goes to the engine as it is."""
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """The coordinator picks the step every rank writes."""
        step = self._step
        if step is None:
            latest = _core.latest_checkpoint(self.path) if os.path.isdir(self.path) else None
            step = 0 if latest is None else int(latest.rsplit("-", 1)[1]) + 1
        # The description goes to every rank with its plan: the ranks' parts of a step must
        # carry the same metadata, and only the coordinator's planner holds DCP's.
        description = _dcp_description(plans)
        return [dataclasses.replace(plan, storage_data=(step, description)) for plan in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Saves this rank's items as its part of the step and waits, with every rank, until the
        checkpoint is committed (DCP's background thread runs this for ``async_save``)."""
        step, metadata = plan.storage_data
        items = _Items()
        results = [items.add(item, planner.resolve_data(item)) for item in plan.items]
        # Synchronous: the engine writes from the tensors' own memory (DCP's stager or the
        # caller keeps them still until write_data returns), with no staging copy of its own.
        checkpointer = _core.Checkpointer(
            self.path, self._saver_options, False,
            _coordination.default_coordinator(self._group))
        try:
            checkpointer.save(step, items.specs, metadata, items.boxes)
        finally:
            try:
                checkpointer.close()  # with every rank: returns once rank 0 committed the step
            finally:
                _logging.drain()
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Nothing left: every rank's write_data returned once the step was committed."""

    def storage_meta(self) -> StorageMeta | None:
        """The checkpoint directory, as DCP reports it."""
        return StorageMeta(checkpoint_id=self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: StrPath) -> bool:
        """Any path: it names the checkpoint directory."""
        return isinstance(checkpoint_id, (str, os.PathLike))


class _Items:
    """This rank's items of a save, as the C++ module takes them (their memory kept here)."""

    def __init__(self) -> None:
        self.specs: list[_core.TensorSpec] = []
        self.boxes: dict[str, tuple[list[int], list[int]]] = {}
        self._keep: list[Any] = []

    def add(self, item: WriteItem, data: Any) -> WriteResult:
        name = item.index.fqn  # an item is stored under its fully qualified name
        if item.type == WriteItemType.BYTE_IO:
            buffer = np.frombuffer(data.getvalue() if isinstance(data, io.BytesIO) else bytes(data),
                                   dtype=np.uint8).copy()
            self._keep.append(buffer)
            self.specs.append((name, "u8", [buffer.size], int(buffer.ctypes.data), buffer.nbytes,
                               None))
            return WriteResult(index=item.index, size_in_bytes=buffer.nbytes, storage_data=None)
        tensor = data.detach().contiguous()
        leaf = _tree.torch_leaf(tensor, name)
        self._keep.append(leaf.array)
        self.specs.append(leaf.spec())
        tensor_data = item.tensor_data
        assert tensor_data is not None
        global_shape = list(tensor_data.size)
        offsets = list(tensor_data.chunk.offsets)
        if list(tensor.shape) != global_shape or any(offsets):
            extra = leaf.stored_shape[len(global_shape):]  # complex: [2]
            self.boxes[name] = (global_shape + extra, offsets + [0] * len(extra))
        return WriteResult(index=item.index, size_in_bytes=leaf.nbytes, storage_data=None)


def _dcp_description(plans: Sequence[SavePlan]) -> dict[str, str]:
    """The description of the whole save, for StorageReader, from every rank's plan: each
    item's kind, dtype and global size, and DCP's planner_data (how flat names map back)."""
    tensors: dict[str, Any] = {}
    byte_items: set[str] = set()
    planner_data: dict[str, Any] = {}
    for plan in plans:
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO or item.tensor_data is None:
                byte_items.add(fqn)
                continue
            properties = item.tensor_data.properties
            tensors[fqn] = {"dtype": _dtypes.torch_dtype_name(properties.dtype),
                            "size": list(item.tensor_data.size),
                            "requires_grad": bool(properties.requires_grad)}
        if isinstance(plan.planner_data, Mapping):
            planner_data.update({fqn: list(path) for fqn, path in plan.planner_data.items()})
    text = json.dumps({"tensors": tensors, "bytes": sorted(byte_items),
                       "planner_data": planner_data}, separators=(",", ":"))
    return {f"{_DCP_KEY_PREFIX}{i:05d}": text[start:start + _PIECE_CHARS]
            for i, start in enumerate(range(0, max(len(text), 1), _PIECE_CHARS))}


class StorageReader(_DcpStorageReader):
    """DCP's StorageReader over asyncckpt: ``dcp.load`` of checkpoint ``step`` of ``path`` (the
    latest by default; ``path`` may also be one checkpoint). Reads checkpoints StorageWriter
    wrote and those CheckpointManager wrote (a state's keys joined with "." are DCP's names);
    every rank reads only the boxes its state asks for, on any number of ranks."""

    def __init__(self, path: StrPath, *, step: int | None = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self._step = step
        self._reader: _core.Reader | None = None
        self._names: dict[str, str] = {}  # DCP fqn -> tensor name
        self._values: dict[str, object] = {}  # fqn -> a plain value of a manager's checkpoint

    def reset(self, checkpoint_id: StrPath | None = None) -> None:
        """A new load; ``checkpoint_id`` (when given) is the checkpoint directory."""
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._reader = None

    def _checkpoint(self) -> str:
        if os.path.exists(os.path.join(self.path, "index")):
            return self.path
        if self._step is not None:
            return os.path.join(self.path, _step_name(self.path, self._step))
        latest = _core.latest_checkpoint(self.path)
        if latest is None:
            raise FileNotFoundError(f"no checkpoint in {self.path}")
        return latest

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata of the checkpoint, from its index (and what StorageWriter or the
        manager stored beside it)."""
        try:
            self._reader = _core.open_reader(self._checkpoint())
        finally:
            _logging.drain()
        return _metadata_of(self._reader, self._names, self._values)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        """Opens the checkpoint on this rank (read_metadata ran on the coordinator only)."""
        if self._reader is None:
            self.read_metadata()

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """Nothing to add."""
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Nothing to add."""
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads each item's box straight from the data files, verified, into the state."""
        assert self._reader is not None
        pending: list[ReadItem] = []
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(self._bytes_of(item.storage_index.fqn)))
            else:
                pending.append(item)
        # One C++ read per round: a round names each tensor at most once.
        while pending:
            this_round: dict[str, ReadItem] = {}
            later: list[ReadItem] = []
            for item in pending:
                if item.storage_index.fqn in this_round:
                    later.append(item)
                else:
                    this_round[item.storage_index.fqn] = item
            self._read_tensors(list(this_round.values()), planner)
            pending = later
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _bytes_of(self, fqn: str) -> bytes:
        assert self._reader is not None
        if fqn in self._values:  # a manager's plain value: DCP reads it as torch.save's bytes
            out = io.BytesIO()
            torch.save(self._values[fqn], out)
            return out.getvalue()
        name = self._names[fqn]
        size = next(shape for n, _, shape, _, _ in self._reader.tensors() if n == name)
        buffer = np.empty(int(np.prod(size)), dtype=np.uint8)
        self._reader.read_into([(name, "u8", list(size), int(buffer.ctypes.data), buffer.nbytes,
                                 None)])
        return buffer.tobytes()

    def _read_tensors(self, items: Sequence[ReadItem], planner: LoadPlanner) -> None:
        assert self._reader is not None
        plan = _tree.Plan()
        targets = []
        infos = {n: (d, s) for n, d, s, _, _ in self._reader.tensors()}
        for item in items:
            name = self._names[item.storage_index.fqn]
            stored, global_shape = infos[name]
            target = planner.resolve_tensor(item).detach()
            lengths = list(item.lengths)
            offsets = [int(a) + int(b) for a, b in zip(item.storage_index.offset or
                                                          [0] * len(lengths),
                                                          item.storage_offsets)]
            buffer = target if (target.is_contiguous() and target.device.type == "cpu" and
                                list(target.shape) == lengths) else torch.empty(
                lengths, dtype=target.dtype)
            extra = list(global_shape)[len(lengths):]  # complex: [2]
            box = None
            if lengths != list(global_shape)[:len(lengths)] or any(offsets):
                box = (list(global_shape), offsets + [0] * len(extra))
            canonical = _dtypes.CANONICAL_OF_STORED.get(stored, stored)
            plan.read(name, canonical, lengths + extra, buffer, buffer.data_ptr(), None, box)
            targets.append((item, target, buffer))
        try:
            self._reader.read_into(plan.specs, plan.boxes)
        finally:
            _logging.drain()
        for item, target, buffer in targets:
            if buffer is not target:
                target.copy_(buffer)
            planner.commit_tensor(item, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: StrPath) -> bool:
        """A checkpoint directory, or one checkpoint."""
        return isinstance(checkpoint_id, (str, os.PathLike))


def _step_name(directory: str, step: int) -> str:
    for name in os.listdir(directory):
        if name.rsplit("-", 1)[-1] == str(step) and ".tmp-" not in name and \
                os.path.exists(os.path.join(directory, name, "index")):
            return name
    raise FileNotFoundError(f"no checkpoint of step {step} in {directory}")


def _metadata_of(reader: _core.Reader, names: dict[str, str],
                 values: dict[str, object]) -> Metadata:
    """DCP's Metadata of ``reader``'s checkpoint; fills ``names`` (fqn -> tensor name) and
    ``values`` (fqn -> plain value of a manager's checkpoint)."""
    user = reader.metadata()
    infos = {n: (d, list(s)) for n, d, s, _, _ in reader.tensors()}
    state: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    planner_data: dict[str, Any] = {}
    pieces = sorted(k for k in user if k.startswith(_DCP_KEY_PREFIX))
    if pieces:  # written by StorageWriter
        described = json.loads("".join(user[k] for k in pieces))
        for fqn, entry in described["tensors"].items():
            names[fqn] = fqn
            state[fqn] = _tensor_metadata(entry["dtype"], entry["size"],
                                          entry.get("requires_grad", False))
        for fqn in described["bytes"]:
            names[fqn] = fqn
            state[fqn] = BytesStorageMetadata()
        planner_data = {fqn: tuple(path) for fqn, path in described["planner_data"].items()}
    else:
        tree = _tree.read_tree(user, reader.path)
        if tree is not None:  # written by CheckpointManager: its tree names everything
            _describe_tree(tree, [], state, planner_data, names, values, infos)
        else:  # written by the C++ savers: tensors by name
            for name, (stored, shape) in infos.items():
                fqn = name.replace("/", ".")
                names[fqn] = name
                state[fqn] = _tensor_metadata(_dtypes.CANONICAL_OF_STORED.get(stored, stored),
                                              shape, False)
                planner_data[fqn] = (fqn,)
    return Metadata(state_dict_metadata=state, planner_data=planner_data,
                    storage_meta=StorageMeta(checkpoint_id=reader.path))


def _tensor_metadata(canonical: str, size: Sequence[int],
                     requires_grad: bool) -> TensorStorageMetadata:
    dtype = _dtypes.torch_dtype(canonical)
    if dtype is None:
        raise TypeError(f"dtype {canonical} has no torch dtype")
    # One chunk: the reader reads any box of it, so every rank's load plan asks for its own.
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=dtype, requires_grad=requires_grad),
        size=torch.Size(size),
        chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(size)),
                                     sizes=torch.Size(size))])


def _describe_tree(node: _tree.Node, keys: list[Any],
                   state: dict[str, TensorStorageMetadata | BytesStorageMetadata],
                   planner_data: dict[str, Any], names: dict[str, str],
                   values: dict[str, object], infos: Mapping[str, Any]) -> None:
    """A manager's tree as DCP's flat names: each leaf's keys joined with ".", the path in
    planner_data (DCP's flatten_state_dict)."""
    if "d" in node:
        for key, child in node["d"]:
            _describe_tree(child, keys + [key], state, planner_data, names, values, infos)
        return
    if "l" in node or "t" in node:
        for i, child in enumerate(node.get("l", node.get("t", []))):
            _describe_tree(child, keys + [i], state, planner_data, names, values, infos)
        return
    fqn = ".".join(str(k) for k in keys)
    planner_data[fqn] = tuple(keys)
    if "T" in node:
        names[fqn] = node["T"]
        state[fqn] = _tensor_metadata(_tree.node_canonical(node), node["sh"], False)
    elif "A" in node:  # a tensor tied to an earlier one: the same stored tensor
        names[fqn] = node["A"]
        stored, shape = infos[node["A"]]
        state[fqn] = _tensor_metadata(_dtypes.CANONICAL_OF_STORED.get(stored, stored), shape,
                                      False)
    else:
        values[fqn] = _tree.decode_value(node, fqn)
        state[fqn] = BytesStorageMetadata()


class Stager(AsyncStager):
    """An AsyncStager for ``dcp.async_save(..., async_stager=Stager())``: copies the state into
    staging buffers it keeps across saves (pinned where CUDA is, so a GPU's copy is a DMA), so
    ``async_save`` blocks for that copy alone after the first save. DTensors stay DTensors (their
    local shards copied). Call ``close()`` after the last save.

    ``cuda_stream_ordered=True`` (CUDA tensors): ``stage`` returns once the copies of GPU memory
    are enqueued on a side stream of each GPU, ordered after the work queued on its current
    stream, and hands DCP a future that the writer waits for; ``async_save`` then returns an
    AsyncSaveResponse whose ``staging_completion`` says when the copies are done. The update
    that changes the state must wait for them: ``wait_before_update(optimizer)`` places that
    wait (on the GPU; the host goes on) before each ``optimizer.step()``; without it, ``stage``
    makes the current streams wait at once. RuntimeError when no GPU is visible.
    """

    _synchronize_after_execute: bool = False

    def __init__(self, *, cuda_stream_ordered: bool = False) -> None:
        if cuda_stream_ordered and not torch.cuda.is_available():
            raise RuntimeError("Stager(cuda_stream_ordered=True) needs a CUDA GPU, and torch "
                               "sees none")
        self._stream_ordered = cuda_stream_ordered
        self._buffers: dict[tuple[str, ...], torch.Tensor] = {}
        self._events: list[Any] = []
        self._side_streams: dict[int, Any] = {}  # GPU ordinal -> the stream its copies run on
        self._ordered: set[int] = set()  # GPUs whose side stream follows the current one now
        self._copies: dict[int, Any] = {}  # GPU ordinal -> the event of its last stage's copies
        self._update_waits = 0
        self._waiter: concurrent.futures.ThreadPoolExecutor | None = None

    def stage(self, state_dict: dict[str, Any]
              ) -> dict[str, Any] | concurrent.futures.Future[dict[str, Any]]:
        """A copy of ``state_dict`` whose tensors live in this stager's buffers; stream-ordered,
        a future of it, done once the GPU copies are."""
        self._ordered.clear()
        staged = self._stage(state_dict, ())
        assert isinstance(staged, dict)
        if not self._stream_ordered:
            return staged
        recorded = {ordinal: self._side_streams[ordinal].record_event()
                    for ordinal in self._ordered}
        self._copies.update(recorded)
        if not self._update_waits:
            self.wait_for_snapshot_copies()
        if self._waiter is None:
            self._waiter = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="asyncckpt-stager")
        return self._waiter.submit(_after_events, list(recorded.values()), staged)

    def _stage(self, value: Any, path: tuple[str, ...]) -> Any:
        if isinstance(value, dict):
            staged = {k: self._stage(v, path + (str(k),)) for k, v in value.items()}
            return collections.OrderedDict(staged) if isinstance(value, collections.OrderedDict) \
                else staged
        if isinstance(value, (list, tuple)):
            return type(value)(self._stage(v, path + (str(i),)) for i, v in enumerate(value))
        if isinstance(value, torch.Tensor):
            return self._copy(value, path)
        return value

    def _copy(self, tensor: torch.Tensor, path: tuple[str, ...]) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if isinstance(tensor, DTensor):
            local = self._copy(tensor.to_local(), path)
            return DTensor.from_local(local, tensor.device_mesh, tensor.placements,
                                      run_check=False, shape=tensor.shape,
                                      stride=tensor.stride())
        key = path + (str(tuple(tensor.shape)), str(tensor.dtype))
        buffer = self._buffers.get(key)
        on_gpu = tensor.device.type == "cuda"
        if buffer is None:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=on_gpu)
            self._buffers[key] = buffer
        if on_gpu and self._stream_ordered:
            self._copy_on_side_stream(tensor, buffer)
            return buffer
        buffer.copy_(tensor.detach(), non_blocking=on_gpu)
        if on_gpu:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch's stub lacks it
            event.record()
            self._events.append(event)
        return buffer

    def _copy_on_side_stream(self, tensor: torch.Tensor, buffer: torch.Tensor) -> None:
        """Enqueues the copy on the GPU's side stream, after the work queued so far on its
        current stream (the step that computed ``tensor``)."""
        ordinal = tensor.device.index if tensor.device.index is not None else \
            torch.cuda.current_device()
        stream = self._side_streams.get(ordinal)
        if stream is None:
            stream = torch.cuda.Stream(device=ordinal)  # type: ignore[no-untyped-call]
            self._side_streams[ordinal] = stream
        if ordinal not in self._ordered:
            stream.wait_stream(torch.cuda.current_stream(ordinal))
            self._ordered.add(ordinal)
        with torch.cuda.stream(stream):
            buffer.copy_(tensor.detach(), non_blocking=True)
        # The caching allocator must not hand the source's memory out before the copy read it.
        tensor.record_stream(stream)

    def wait_for_snapshot_copies(self) -> None:
        """Makes each GPU's current stream wait (on the GPU; the host goes on) for the copies
        of the stream-ordered stages so far. Call it right before the state changes, or let
        ``wait_before_update`` call it."""
        copies, self._copies = self._copies, {}
        for ordinal, event in copies.items():
            torch.cuda.current_stream(ordinal).wait_event(event)

    def wait_before_update(self, optimizer: torch.optim.Optimizer) -> _streams.UpdateWaitHandle:
        """Registers an ``optimizer.step()`` pre-hook that calls ``wait_for_snapshot_copies``,
        so the copies overlap the forward and backward passes, which only read the state.
        Returns a handle; its ``remove()`` takes the hook off."""
        handle = _streams.UpdateWaitHandle(self, optimizer)
        self._update_waits += 1
        return handle

    def _update_wait_removed(self) -> None:
        self._update_waits -= 1

    def synchronize_staging(self) -> None:
        """Waits for the GPU copies of the last stage()."""
        events, self._events = self._events, []
        for event in events:
            event.synchronize()
        for stream in self._side_streams.values():
            stream.synchronize()

    def close(self) -> None:
        """Waits for the copies and drops the buffers."""
        self.synchronize_staging()
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
            self._waiter = None
        self._buffers.clear()


def _after_events(events: list[Any], staged: dict[str, Any]) -> dict[str, Any]:
    """``staged`` once every event has completed: on the stager's own thread, for DCP's writer."""
    for event in events:
        event.synchronize()
    return staged
