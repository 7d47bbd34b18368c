"""CheckpointManager, load() and the statistics types: the Python face of asyncckpt."""

from __future__ import annotations

import contextlib
import inspect
import math
import numbers
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Union

from . import (
    _coordination,
    _core,
    _dtypes,
    _location,
    _logging,
    _pickled,
    _prefault,
    _resume,
    _saves,
    _stateful,
    _step_metadata,
    _steps,
    _streams,
    _tree,
)
from ._saves import SaveFuture, Stats

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from types import TracebackType

    import torch
    from typing_extensions import Self

StrPath = Union[str, "os.PathLike[str]"]

CheckpointError = _core.CheckpointError


def _close_quietly(core: _core.Checkpointer) -> None:
    """At garbage collection or interpreter exit: wait for saves in flight, report, close."""
    try:
        core.close()
    except Exception as error:  # noqa: BLE001 - reported, never raised from a finalizer
        warnings.warn(f"asyncckpt: a checkpoint save failed: {error}", RuntimeWarning)
    finally:
        _logging.drain()


def option_names() -> list[str]:
    """The options CheckpointManager takes as keywords beyond its own: SaverOptions' fields."""
    return sorted(name for name, value in vars(_core.SaverOptions).items()
                  if isinstance(value, property) and name not in _MANAGER_SET_OPTIONS)


# SaverOptions' fields the manager sets from its own keywords: best_mode goes with best_fn.
_MANAGER_SET_OPTIONS = frozenset({"best_mode"})


def _check_best(best_fn: object, best_mode: object, max_to_keep: int) -> None:
    """TypeError or ValueError naming what is wrong with Orbax's best_fn / best_mode."""
    if best_mode not in ("max", "min"):
        raise ValueError(f"best_mode must be 'max' or 'min', not {best_mode!r}")
    if best_fn is None:
        return
    if not callable(best_fn):
        raise TypeError(f"best_fn must be a callable of the metrics, not a "
                        f"{type(best_fn).__name__}")
    if max_to_keep <= 0:
        raise ValueError(f"best_fn needs max_to_keep > 0 (how many of the best checkpoints to "
                         f"keep), got max_to_keep={max_to_keep}")


def _score_entry(best_fn: Callable[[Any], Any] | None, step: int,
                 metrics: Mapping[str, object] | None) -> dict[str, str]:
    """The metadata entry holding ``best_fn(metrics)``, the score the C++ retention ranks the
    checkpoint by; none without best_fn or metrics (a save without metrics is never deleted, as
    Orbax's keep_checkpoints_without_metrics). ValueError or TypeError, before anything is
    written, when best_fn raises or returns no finite number."""
    if best_fn is None or metrics is None:
        return {}
    try:
        value = best_fn(metrics)
    except Exception as error:
        raise ValueError(f"best_fn raised on the metrics of step {step} "
                         f"({type(error).__name__}: {error}); nothing was saved") from error
    # A Python or NumPy number, or a 0-d array (a jax.Array, an np.ndarray); a bool is a slip.
    is_number = isinstance(value, numbers.Real) or (
        getattr(value, "shape", None) == () and hasattr(value, "__float__"))
    if isinstance(value, bool) or not is_number:
        raise TypeError(f"best_fn must return a number; for the metrics of step {step} it "
                        f"returned a {type(value).__name__} ({value!r}); nothing was saved")
    try:
        score = float(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"best_fn must return a number; for the metrics of step {step} it "
                        f"returned {value!r} ({error}); nothing was saved") from None
    if not math.isfinite(score):
        raise ValueError(f"best_fn returned {score} for the metrics of step {step}: a score "
                         f"must be finite to rank the checkpoint; nothing was saved")
    # repr() is the shortest text that reads back as the same double (C++ from_chars).
    return {_core.RETENTION_SCORE_KEY: repr(score)}


def _saver_options(options: Mapping[str, Any], owner: str = "CheckpointManager",
                   own: Sequence[str] = ("save_interval_steps", "asynchronous")
                   ) -> _core.SaverOptions:
    """The C++ SaverOptions with ``options`` set; TypeError naming an unknown or ill-typed one
    (``owner`` takes them, beside its ``own`` keywords).

    Defaults are SaverOptions' own and ranges are checked by the C++ Checkpointer's Create, so
    each is written and checked in one place.
    """
    saver_options = _core.SaverOptions()
    known = option_names()
    for name, value in options.items():
        if name not in known:
            raise TypeError(f"{owner} got an unknown option {name!r}; its options are "
                            f"{', '.join(own)} and {', '.join(known)}")
        expected = type(getattr(saver_options, name)).__name__
        try:
            # pybind11 takes True for an int; a step count or a size that is a bool is a slip.
            if isinstance(value, bool) and expected != "bool":
                raise TypeError(name)
            setattr(saver_options, name, value)
        except TypeError:
            raise TypeError(f"option {name}={value!r} cannot be set: expected "
                            f"{'None or ' if name in _OPTIONAL_OPTIONS else ''}a {expected}"
                            f"{' >= 0' if expected == 'int' else ''}") from None
    return saver_options


# SaverOptions' fields that are unset by default (std::optional).
_OPTIONAL_OPTIONS = frozenset({"save_steps", "save_secs"})


def _check_schedule(save_steps: object, save_secs: object, save_interval_steps: object) -> None:
    """ValueError unless at most one of the three schedules is given."""
    given = [name for name, value in (("save_steps", save_steps), ("save_secs", save_secs),
                                      ("save_interval_steps", save_interval_steps))
             if value is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of save_steps, save_secs and save_interval_steps, "
                         f"not {' and '.join(given)}")


class CheckpointManager:
    """Saves and restores a training job's state in a checkpoint directory.

    Options (keywords): ``save_interval_steps`` and ``asynchronous`` are the manager's own; every
    other is a field of the C++ SaverOptions under its own name, with its default
    (``option_names()`` lists them; ``metadata`` is SaverOptions' user_metadata). At most one
    schedule drives ``maybe_save`` and ``should_save``; with none, only ``save`` may be called:

    - ``save_steps=N`` is TensorFlow's rule, as in the C++ hooks: the first step seen, then the
      first step at least N steps after the last save;
    - ``save_interval_steps=N`` is Orbax's: a step is due when ``step % N == 0``, so the step
      numbers of the checkpoints are the same in every run and after every restart;
    - ``save_secs=S``: the first step seen, then the first step S seconds after the last save.

    Either way a step that is not above every step saved so far is never due. A bad option
    raises ValueError (a bad value) or TypeError (an unknown name or a wrong type).

    Retention, as Orbax's manager keeps checkpoints (docs/durability.md): ``max_to_keep=N``
    (default 5; 0 keeps all) keeps the newest N; ``keep_period=P`` also keeps, listed, every
    checkpoint whose ``step % P == 0``; ``best_fn=f`` (a callable of a save's ``metrics``
    returning a number) with ``best_mode="max"`` (the default) or ``"min"`` keeps instead the N
    checkpoints whose ``f(metrics)`` is highest (lowest), equal scores favouring the newer, and
    never deletes a checkpoint saved without metrics; the newest is deleted at once when it
    ranks below N others (with several ranks, at the next save). The score is computed at
    ``save`` and stored in the checkpoint, so a new manager over the directory ranks as this one
    did. ``best_fn`` needs ``max_to_keep > 0``;
    a ``best_fn`` that raises or returns no finite number fails that ``save`` (ValueError or
    TypeError) before anything is written.

    A state is a dict, list or tuple of tensors, arrays, plain values and stateful objects
    (anything with ``state_dict()`` / ``load_state_dict()``: modules, optimizers, schedulers),
    nested. Steps are ints in [0, 2**63 - 1]; ``save`` of a step that is not above every saved
    step raises StepAlreadyExistsError unless ``force=True``.

    ``asynchronous=True`` (the default): ``save`` returns once the state is copied into pinned
    staging memory; compression, writing and the commit run on background threads.
    ``asynchronous=False``: ``save`` returns once the checkpoint is committed.

    A save that fails in the background raises ``CheckpointError`` at the next ``save`` /
    ``maybe_save`` / ``wait_until_finished`` / ``close`` with ``on_error="stop"`` (and at every
    later one: the manager saves nothing more), or is logged and warned about (RuntimeWarning)
    with ``on_error="continue"``. Earlier checkpoints are never touched by a failed save.

    ``cuda_stream_ordered=True`` (CUDA tensors, asynchronous): ``save`` returns once the copies
    of GPU memory are enqueued, ordered after the work queued on ``torch.cuda.current_stream()``.
    The update that changes the state must wait for them: ``wait_before_update(optimizer)``
    inserts that wait before each ``optimizer.step()``; without it, ``save`` makes the current
    stream wait at once. Raises RuntimeError when no GPU is visible.

    Several processes (a ``torchrun`` job): every rank makes a manager over the same shared
    directory and calls ``save`` / ``maybe_save`` / ``restore`` for the same steps, as it would a
    collective. ``process_group`` (default: torch.distributed's default group, when it is
    initialized with several ranks) or a ``coordinator`` (``asyncckpt._coordination``'s) names
    the ranks. Each rank saves what it holds: a DTensor (FSDP2's parameters and optimizer state)
    as its local shard of the global tensor, anything else as a replica written once; rank 0
    commits each step once every rank's part is durable, all or nothing, and decides retention;
    a failure on one rank fails the next save on every rank, naming it. ``restore`` reads each
    rank's own shard, on any number of ranks.

    Not thread-safe beyond this: calls from several threads are serialised.
    """

    def __init__(self, directory: StrPath, *, save_interval_steps: int | None = None,
                 asynchronous: bool = True, process_group: Any = None,
                 coordinator: _core.Coordinator | None = None,
                 best_fn: Callable[[Any], Any] | None = None, best_mode: str = "max",
                 **options: Any) -> None:
        _check_schedule(options.get("save_steps"), options.get("save_secs"),
                        save_interval_steps)
        saver_options = _saver_options(
            options, own=("save_interval_steps", "asynchronous", "best_fn", "best_mode"))
        _check_best(best_fn, best_mode, saver_options.max_to_keep)
        self._best_fn = best_fn
        if best_fn is not None:
            saver_options.best_mode = best_mode
        self._save_interval_steps = _steps.check_save_interval_steps(save_interval_steps)
        self._scheduled = (self._save_interval_steps is not None or
                           saver_options.save_steps is not None or
                           saver_options.save_secs is not None)
        if saver_options.save_steps is None and saver_options.save_secs is None:
            # The C++ options need a schedule; save() alone ignores it, maybe_save refuses,
            # and save_interval_steps is decided here.
            saver_options.save_steps = 1
        if saver_options.cuda_stream_ordered:
            _streams.check_gpu_visible()
        self._stream_ordered = saver_options.cuda_stream_ordered
        self._update_waits = 0  # live wait_before_update hooks
        self._copying_gpus: set[int] = set()  # GPUs whose copies no stream waited for yet
        self._directory = os.fspath(directory)
        self._on_error = saver_options.on_error
        self._on_busy = saver_options.on_busy
        self._allow_fresh_start = saver_options.allow_fresh_start
        if coordinator is None:
            coordinator = _coordination.default_coordinator(process_group)
        elif process_group is not None:
            raise ValueError("give process_group or coordinator, not both")
        self._coordinator = coordinator
        self._core = _core.Checkpointer(self._directory, saver_options, bool(asynchronous),
                                        coordinator)
        self._closed = False
        self._finalizer = weakref.finalize(self, _close_quietly, self._core)
        self._saves = _saves.SaveTracker(self._core)
        self._ledger = _steps.StepLedger(self._core.latest_step())
        self._last_submitted: int | None = None
        # A training job that resumes (a schedule says it will save) prepares staging like the
        # latest checkpoint while it restores; an evaluation takes no lock and prepares nothing.
        if bool(asynchronous) and coordinator is None and self._scheduled:
            self._prepare_like_latest()
        _logging.drain()

    def _prepare_like_latest(self) -> None:
        """Starts making staging sized like the latest checkpoint, in the background: the first
        save after a resume would otherwise set it up on the training thread (seconds per GiB).
        A failure (the directory locked by another job) is logged: the first save meets it again
        and raises it."""
        try:
            self._core.prepare_like_latest()
        except CheckpointError as error:
            _logging.logger.warning("could not prepare staging for a resume (the first save "
                                    "will): %s", error)

    # ---- saving ----------------------------------------------------------------------------

    def save(self, step: int, state: object, *, force: bool = False,
             metrics: Mapping[str, object] | None = None,
             metadata: Mapping[str, object] | None = None,
             allow_pickle: bool = False) -> SaveFuture:
        """Saves ``state`` as checkpoint ``step`` now, and returns the save's SaveFuture.

        Returns once the state may change again (asynchronous: after the snapshot copy; the
        future tells when the checkpoint is durable, and the save's own error if it failed).
        ``step`` must be above every step saved so far (StepAlreadyExistsError otherwise)
        unless ``force``. ``metrics`` and ``metadata`` (JSON values) are stored with this step
        and read back by ``metadata(step)``; with ``best_fn``, ``best_fn(metrics)`` ranks it. ``allow_pickle`` stores values with no exact form
        (see load()).
        """
        step = _steps.check_step(step)
        self._ledger.check_new(step, force, self._core.checkpoint_path)
        future = self._save_now(step, state, metrics, metadata, allow_pickle, may_skip=False)
        assert future is not None  # save() is never skipped
        return future

    def prepare(self, state: object, reserve_bytes: int = 0) -> None:
        """Starts allocating the engine and pinned staging for ``state``, so the first save
        pays none, and returns without waiting (one process; a job of several waits, as every
        rank prepares together). A save before it is done waits for the rest.

        A resume needs no call: an asynchronous manager of one process with a schedule starts
        preparing staging sized like the latest checkpoint when it is made, so it is ready by
        the time ``restore`` has filled the state. ``reserve_bytes``: staging for a state that
        will grow (0 sizes it for ``state``).
        """
        leaves, _ = self._flatten_state(state, allow_pickle=True)  # sizes only: no unpickling
        self._core.prepare([leaf.spec() for leaf in leaves], int(reserve_bytes), _boxes(leaves))

    def _flatten_state(self, state: object,
                       allow_pickle: bool) -> tuple[list[_tree.Leaf], dict[str, str]]:
        """The leaves and tree metadata of ``state``; a framework's manager (asyncckpt.jax)
        turns its own containers and arrays into these first."""
        return _flatten(state, allow_pickle)

    def should_save(self, step: int) -> bool:
        """Whether ``maybe_save(step, ...)`` would save: with save_interval_steps,
        ``step % N == 0``; with save_steps or save_secs, the C++ timer's rule; never for a step
        not above every step saved so far."""
        step = _steps.check_step(step)
        if not self._scheduled or not self._ledger.is_new(step):
            return False
        if self._save_interval_steps is not None:
            return step % self._save_interval_steps == 0
        return self._core.due(step)

    def maybe_save(self, step: int, state: object, *,
                   metrics: Mapping[str, object] | None = None,
                   metadata: Mapping[str, object] | None = None,
                   allow_pickle: bool = False) -> SaveFuture | None:
        """Saves ``state`` as checkpoint ``step`` when ``should_save(step)``, as ``save`` does.

        Returns the save's SaveFuture when a save was taken, None when none was due (or with
        on_busy="skip" when staging was still busy), so ``if manager.maybe_save(...)`` reads as
        before. Cheap when no save is due: the state is not even looked at.
        """
        if not self._scheduled:
            raise ValueError("maybe_save needs save_steps, save_interval_steps or save_secs; use "
                             "save() to save at a step of your choice")
        if not self.should_save(step):
            self._report_failure()
            return None
        return self._save_now(_steps.check_step(step), state, metrics, metadata, allow_pickle,
                              may_skip=True)

    def _save_now(self, step: int, state: object, metrics: Mapping[str, object] | None,
                  metadata: Mapping[str, object] | None, allow_pickle: bool,
                  may_skip: bool) -> SaveFuture | None:
        """The save of ``step`` that save and maybe_save (``may_skip``: staging busy with
        on_busy="skip" skips it) take: the future, or None when skipped."""
        step_metadata = {**_step_metadata.encode(metrics, metadata),
                         **_score_entry(self._best_fn, step, metrics)}
        leaves, tree_metadata = self._flatten_state(state, allow_pickle)
        specs = [leaf.spec() for leaf in leaves]
        future = None
        try:
            with self._stream_ordering(specs):
                taken = self._hand_over(step, leaves, {**tree_metadata, **step_metadata},
                                        may_skip)
            self._last_submitted = step  # seen by the C++ timer, saved or skipped
            if taken:
                self._ledger.saved(step)
                future = self._saves.made(step)
        finally:
            _logging.drain()
        self._warn_about_failures()
        return future

    def _hand_over(self, step: int, leaves: list[_tree.Leaf], metadata: dict[str, str],
                   may_skip: bool) -> bool:
        """Gives the engine the save of ``leaves``, returning once it holds its copy: whether
        it was taken. (asyncckpt.jax hands it over on a thread of its own on the CPU.)"""
        specs = [leaf.spec() for leaf in leaves]
        if may_skip:
            return self._core.maybe_save(step, specs, metadata, _boxes(leaves))
        self._core.save(step, specs, metadata, _boxes(leaves))
        return True

    @contextlib.contextmanager
    def _stream_ordering(self, specs: list[_core.TensorSpec]) -> Iterator[None]:
        """Around a save: its GPU copies follow the current streams, and the update waits for
        them (at once unless a wait_before_update hook will)."""
        gpus = _streams.cuda_ordinals(specs) if self._stream_ordered else set()
        _streams.follow_current_streams(gpus)
        try:
            yield
        finally:
            self._copying_gpus |= gpus  # even after a failure: some copies may be under way
            _streams.stop_following(gpus)
            if not self._update_waits:
                self.wait_for_snapshot_copies()

    def wait_for_snapshot_copies(self) -> None:
        """Makes the current CUDA stream wait (on the GPU; the host goes on) for the copies of
        the stream-ordered saves so far. Call it right before the state changes, or let
        ``wait_before_update`` call it. Nothing to do without outstanding copies."""
        gpus, self._copying_gpus = self._copying_gpus, set()
        _streams.wait_on_current_streams(gpus)

    def wait_before_update(self, optimizer: torch.optim.Optimizer) -> _streams.UpdateWaitHandle:
        """Registers an ``optimizer.step()`` pre-hook that calls ``wait_for_snapshot_copies``:
        the forward and backward passes after a stream-ordered save only read the parameters,
        so the copy (on a non-blocking stream of the device's own) can overlap them, and only
        the update waits. Returns a handle; its ``remove()`` takes
        the hook off. Harmless without stream-ordered copies."""
        handle = _streams.UpdateWaitHandle(self, optimizer)
        self._update_waits += 1
        return handle

    def _update_wait_removed(self) -> None:
        self._update_waits -= 1

    def _report_failure(self) -> None:
        """Raises a background failure (on_error="stop") when no save is due; logs the lines."""
        # No step is due twice in the C++ timer, so asking about the last one it saw only
        # delivers what the background reported (nothing to deliver before the first save).
        if self._last_submitted is not None:
            self._core.check_due(self._last_submitted)
        _logging.drain()

    def wait_until_finished(self) -> None:
        """Blocks until every save so far is durable and committed (or failed). Retention's
        removal of the checkpoints those saves dropped goes on in the background; ``close``
        waits for it."""
        try:
            self._core.wait_until_finished()
        finally:
            _logging.drain()
        self._warn_about_failures()

    def close(self) -> None:
        """Waits like wait_until_finished, and for retention's removals, then refuses further
        saves. Idempotent."""
        self._closed = True
        self._finalizer.detach()
        try:
            self._core.close()
        finally:
            _coordination.close(self._coordinator)
            _logging.drain()
        self._warn_about_failures()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
            return
        # Already unwinding: wait for the saves anyway, but let the first error through.
        try:
            self.close()
        except CheckpointError as error:
            warnings.warn(f"asyncckpt: a checkpoint save failed: {error}", RuntimeWarning)

    def _warn_about_failures(self) -> None:
        """Resolves the futures of the saves finished since the last call; with
        on_error="continue", warns once about each save that failed."""
        for save in self._saves.take_failed():
            if self._on_error == "continue":
                warnings.warn(f"asyncckpt: the save of step {save.step} failed; training goes "
                              f"on (on_error='continue'): {save.error}", RuntimeWarning)

    # ---- what is there ---------------------------------------------------------------------

    @property
    def directory(self) -> str:
        """The checkpoint directory."""
        return self._directory

    def all_steps(self) -> list[int]:
        """Steps of the retained checkpoints in save order (committed saves only): the last is
        ``latest_step()``. After a forced save of a lower step that step comes last. Waits for
        this manager's own saves in flight first, so a save just made is listed."""
        self._saves.wait_all()
        return list(self._core.all_steps())

    def latest_step(self) -> int | None:
        """The step the last successful save wrote, as the state file records it: what a
        resume restores, what ``latest_checkpoint()`` and ``asyncckpt.load(directory)`` name,
        and the step a new save must be above. None when there is none. Waits for this
        manager's own saves in flight first: a save just made is the latest once durable."""
        self._saves.wait_all()
        return self._core.latest_step()

    def checkpoint_path(self, step: int) -> str:
        """The directory of checkpoint ``step``."""
        return self._core.checkpoint_path(_steps.check_step(step))

    def metadata(self, step: int | None = None) -> _step_metadata.StepMetadata:
        """The metrics and metadata that ``save`` stored with checkpoint ``step`` (the latest
        when None), with its path and wall time. FileNotFoundError when there is no such
        checkpoint."""
        try:
            reader = self._core.open(None if step is None else _steps.check_step(step))
        finally:
            _logging.drain()
        return _step_metadata.decode(reader.step, reader.path, reader.wall_time,
                                     reader.metadata())

    def stats(self) -> Stats:
        """A Stats: totals and every save's SaveStats, as the C++ SaverTotals."""
        return _saves.stats_of(self._core.totals())

    # ---- restoring -------------------------------------------------------------------------

    def restore(self, state: dict[Any, Any] | list[Any], step: int | None = None, *,
                partial: bool = False, allow_pickle: bool = False) -> int | None:
        """Fills ``state`` in place from checkpoint ``step`` (the latest when None).

        Only what ``state`` names is read: keys the checkpoint has and ``state`` lacks are
        neither read nor added, so ``restore({"model": model})`` reads the model's bytes alone.
        Tensors and arrays are read straight into their memory, every chunk verified; their
        dtypes and shapes must match the checkpoint's (ValueError naming the key otherwise, and
        then nothing is changed). Dicts and lists are updated in place; plain values and tuples
        are replaced by the saved ones. An empty dict, or None, in ``state`` is a placeholder
        that takes whatever the checkpoint holds there (a fresh optimizer's empty ``state``).

        A key of ``state`` that the checkpoint lacks is a ValueError naming every such key
        (nothing is changed), as DCP refuses it: restoring a model whose new layer silently
        keeps its initial weights is a bug. ``partial=True`` leaves such keys as they are.

        Waits for this manager's own saves in flight first, so a save just made is restored.
        Returns the restored step, or None (``state`` untouched) when there is no checkpoint
        yet; raises CheckpointError naming them when there is none but damaged ones
        (quarantined at the first save; see docs/durability.md), unless allow_fresh_start.

        When ``step`` is None and a chunk of the latest checkpoint fails its checksum, that one is
        quarantined as start-up does (logged naming file, tensor and chunk) and the newest good
        one restored. An explicit ``step`` that is damaged raises CheckpointError instead.

        A stateful object in ``state`` (a module, an optimizer, a scheduler: anything with
        ``state_dict()`` / ``load_state_dict()``) is restored as DCP does it: a fresh
        ``state_dict()`` of it is filled from everything the checkpoint holds for it and handed
        to its ``load_state_dict()``; the object stays where it was. A plain state dict in
        ``state`` is filled like any dict, and handing it to its owner is then the caller's job.
        ``allow_pickle`` reads values saved with pickle (see load()).
        """
        if not isinstance(state, (dict, list)):
            raise TypeError("restore fills a dict or list in place; use load() for a new one")
        self._saves.wait_all()  # a save this manager just made is restorable

        def fill(reader: _core.Reader) -> int:
            with _pickled.allowed(allow_pickle), _stateful.restoring(state) as whole:
                _restore_from(reader, state, whole, partial)
            return reader.step

        restored = self._read_latest_good(fill, step, fresh_start_allowed=True)
        if isinstance(restored, _resume.Nothing):
            return None
        return restored

    def _read_latest_good(self, read: Callable[[_core.Reader], _resume.T], step: int | None, *,
                          fresh_start_allowed: bool) -> _resume.T | _resume.Nothing:
        """_resume.read_latest_good, then _refuse_to_start_afresh when nothing was read."""
        try:
            checked = None if step is None else _steps.check_step(step)
            read_now, found = _resume.read_latest_good(self._core, self._ledger, read, checked)
            if isinstance(read_now, _resume.Nothing):
                self._refuse_to_start_afresh(fresh_start_allowed, found)
            return read_now
        finally:
            _logging.drain()

    def _refuse_to_start_afresh(self, fresh_start_allowed: bool = True,
                                found: list[str] | None = None) -> None:
        """CheckpointError naming the damaged checkpoints (and ``found``, what this call found
        wrong) when there is nothing to read but them: a None (or a FileNotFoundError) here would
        train from step 0 beside them. With ``fresh_start_allowed`` and allow_fresh_start,
        nothing is raised."""
        _resume.refuse_newer_release(self._directory, self._core)
        if fresh_start_allowed and self._allow_fresh_start:
            return
        damaged = self._core.damaged()
        if damaged:
            raise CheckpointError(
                f"{self._directory} has no checkpoint to restore, only damaged ones: "
                + "; ".join(damaged) + (f" (found now: {'; '.join(found)})" if found else "")
                + ". Inspect them (asyncckpt verify), restore a good copy, or delete them or "
                "pass allow_fresh_start=True to train from step 0")

    def load(self, step: int | None = None, *, allow_pickle: bool = False,
             map_location: object = None) -> Any:
        """A new state from checkpoint ``step`` (the latest when None), as asyncckpt.load
        (``map_location`` too).

        Past a damaged latest checkpoint as restore(). FileNotFoundError only when there was
        never a checkpoint; CheckpointError naming the damage when there are only damaged ones."""
        device = _location.device_of(map_location)

        def build(reader: _core.Reader) -> Any:
            with _pickled.allowed(allow_pickle):
                return _load_from(reader, device)

        self._saves.wait_all()  # a save this manager just made is loadable

        loaded = self._read_latest_good(build, step, fresh_start_allowed=False)
        if isinstance(loaded, _resume.Nothing):
            raise FileNotFoundError(f"no checkpoint in {self._directory}")
        return loaded


def _manager_signature() -> inspect.Signature:
    """CheckpointManager's signature with every option and its default spelled out, for help()
    and editors: the declared parameters, then SaverOptions' fields in place of **options."""
    declared = inspect.signature(CheckpointManager.__init__)
    defaults = _core.SaverOptions()
    parameters = [p for p in declared.parameters.values() if p.kind != p.VAR_KEYWORD]
    parameters += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                     default=getattr(defaults, name))
                   for name in option_names()]
    return declared.replace(parameters=parameters)


setattr(CheckpointManager.__init__, "__signature__", _manager_signature())  # noqa: B010


def _boxes(leaves: list[_tree.Leaf]) -> dict[str, tuple[list[int], list[int]]]:
    """The shards among ``leaves`` (DTensors' local parts): name -> (global shape, offset)."""
    return {leaf.name: leaf.box for leaf in leaves if leaf.box is not None}


def _flatten(state: object, allow_pickle: bool) -> tuple[list[_tree.Leaf], dict[str, str]]:
    """(leaves, metadata) of a state whose stateful objects give their state dicts. The caller
    keeps the leaves until the C++ call has copied them: they own the contiguous copies."""
    with _pickled.allowed(allow_pickle):
        return _tree.flatten(_stateful.saveable(state))


def _restore_from(reader: _core.Reader, state: dict[Any, Any] | list[Any],
                  whole: set[int] | None = None, partial: bool = False) -> None:
    """Reads what ``state`` names from ``reader`` into it (see CheckpointManager.restore);
    ``whole``: ids of the dicts that take every saved key (stateful objects' state dicts)."""
    tree = _tree.read_tree(reader.metadata(), reader.path)
    plan = _tree.Plan()
    plan.whole = whole or set()
    if tree is None:
        _plan_by_name(reader, state, plan)
    else:
        if ("d" in tree) != isinstance(state, dict) or ("l" in tree) != isinstance(state, list):
            raise ValueError(f"cannot restore from {reader.path}: it holds "
                             f"{_tree.describe_node(tree)}, the given state is a "
                             f"{type(state).__name__}")
        _tree.fill(state, tree, [], plan)
    if plan.missing and not partial:
        raise ValueError(f"cannot restore: {', '.join(plan.missing)} "
                         f"{'is' if len(plan.missing) == 1 else 'are'} in the given state but "
                         f"not in the checkpoint {reader.path}; pass partial=True to leave "
                         f"{'it' if len(plan.missing) == 1 else 'them'} as "
                         f"{'it is' if len(plan.missing) == 1 else 'they are'}")
    reader.read_into(plan.specs, plan.boxes)
    plan.finish()


def _plan_by_name(reader: _core.Reader, state: dict[Any, Any] | list[Any],
                  plan: _tree.Plan) -> None:
    """A checkpoint without a Python tree (written by the C++ hooks, or imported from
    safetensors): tensors by name only, its keys joined with "/" or, as Hugging Face names them,
    with "." ({"model": module} finds "model.fc.weight")."""
    infos = {name: (dtype, shape) for name, dtype, shape, _, _ in reader.tensors()}
    for name, array, names in _tree.template_leaves(state, [], []):
        if name not in infos and ".".join(names) in infos:
            name = ".".join(names)
        if name not in infos:
            plan.missing.append(f"'{name}'")
            continue
        stored, shape = infos[name]
        canonical = _dtypes.CANONICAL_OF_STORED.get(stored, stored)
        # Only the canonical dtype and the shape are compared, whichever library holds it.
        node: _tree.Node = {"T": name, "k": "torch", "dt": canonical, "sh": list(shape)}
        _tree.fill_tensor(array, node, names, plan)


def _load_from(reader: _core.Reader, device: torch.device | None = None) -> object:
    """A new state read from ``reader``, its torch tensors on ``device`` (None: the CPU)."""
    tree = _tree.read_tree(reader.metadata(), reader.path)
    plan = _tree.Plan()
    plan.device = device
    state: object
    if tree is None:
        tensors: dict[str, object] = {}
        for name, stored, shape, _, _ in reader.tensors():
            canonical = _dtypes.CANONICAL_OF_STORED[stored]
            numpy_dtype = _dtypes.numpy_dtype(canonical)
            node: _tree.Node = {"T": name, "k": "numpy" if numpy_dtype is not None else "torch",
                                "dt": numpy_dtype.str if numpy_dtype is not None else canonical,
                                "sh": list(shape)}
            tensors[name] = _tree.build(node, [name], plan)
        state = tensors
    else:
        state = _tree.build(tree, [], plan)
    _prefault.read_into_new_memory(reader, plan.specs, plan.boxes)
    plan.finish()
    return state


def load(path: StrPath, *, allow_pickle: bool = False, map_location: object = None) -> Any:
    """A new state (nested dicts, lists, tensors, arrays, values as saved) from ``path``.

    ``path`` is a checkpoint (".../model.ckpt-1000") or a checkpoint directory (its latest
    checkpoint). Torch tensors come back on the CPU (see ``map_location``); tensors saved as one memory (tied weights)
    come back as one tensor. Stateful objects come back as the state dicts they saved. A
    checkpoint written without the Python layer (by the C++ hooks) comes back as a flat dict of
    NumPy arrays keyed by tensor name (torch tensors for bfloat16, which NumPy lacks).

    ``allow_pickle``: values saved with ``allow_pickle=True`` are read back only with it too,
    because loading a pickle runs code; without it such a checkpoint raises ValueError.

    ``map_location``: as torch.load's, a device string ("cpu", "cuda", "cuda:1") or a
    torch.device that every torch tensor is loaded onto; NumPy arrays stay in host memory. A
    device that is not there (a GPU torch cannot see) is a ValueError naming it before anything
    is read. The dict and callable forms are a TypeError: a checkpoint does not record the
    device each tensor was saved from.
    """
    path = os.fspath(path)
    device = _location.device_of(map_location)

    def build(reader: _core.Reader) -> object:
        return _load_from(reader, device)

    try:
        with _pickled.allowed(allow_pickle):
            if os.path.exists(os.path.join(path, "index")):
                return build(_core.open_reader(path))
            return _resume.load_from_directory(path, build)
    finally:
        _logging.drain()


def latest_checkpoint(directory: StrPath) -> str | None:
    """The path of the checkpoint a resume in ``directory`` would use: the state file's latest
    (the last successful save), passing over damaged ones. None when there is none to resume;
    CheckpointError naming them when there are only damaged ones (or one a newer release
    wrote)."""
    return _resume.latest_checkpoint(os.fspath(directory))
