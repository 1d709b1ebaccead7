"""The learner's side of population-based training (--with_pbt): `Population`.

Each policy's rank-0 learner serves its status and, when asked, a snapshot of its whole state
(weights, optimiser state, hyperparameters) through its learner service; at each look it asks
the other policies' rank-0 learners (`--policy_hosts`) for theirs, decides by `pbt.decide`, and
copies a donor's state when the rule says so. Its learners take the decision together: rank 0
broadcasts it and, after a copy, its variables (Horovod, within the policy's learners only).

What it keeps across a restart: the hyperparameters, the frames of the next look and the
number of copies, for each checkpoint, and the games it is ranked on for the newest few, in
`pbt_state.json` beside the checkpoints (written before the checkpoint, so that the checkpoint
a resume restores always has its entry). Every
look is a line of `pbt.jsonl` in the policy's folder, and points under pbt/ in TensorBoard.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import math
import os
import random
import stat
import time
from collections.abc import Callable, Collection, Sequence

import numpy as np
import tensorflow as tf

from impala import run_folder
from impala.configs import LearnerJobConfig
from impala.learner import allreduce, checkpoint_folder, checkpoints, pbt
from impala.learner.optimise import Trainer, nonnegative_slots
from impala.transport import wire
from impala.transport.peers import PolicyPeer
from impala.transport.server import MAX_STATE_WAITERS

STATE_FILE = "pbt_state.json"
# The most `STATE_FILE` may hold: an entry of about 200 bytes for each kept checkpoint, which
# --keep_checkpoints and --keep_checkpoint_every_frames may make many over a long run, and in
# the newest `ENTRIES_WITH_RETURNS` entries the policy's last --pbt_objective_games returns
# (`impala.configs.pbt.MAX_OBJECTIVE_GAMES` at most: about 320 KB each). So 64 MiB holds
# about 300,000 kept checkpoints.
MAX_STATE_FILE_BYTES = 64 << 20
# The entries that keep the games the policy is ranked on: a resume restores the newest
# checkpoint, or one of the few before it when the newest cannot be read; one from an older
# entry (kept by --keep_checkpoint_every_frames, or by a --keep_checkpoints above 3) starts its
# window of games empty.
ENTRIES_WITH_RETURNS = 4
LOG_FILE = "pbt.jsonl"
_REMEDY = "; remove it to resume with the flags' hyperparameters"
# How long rank 0 waits for another policy's status, and for its state (which that learner
# takes between two of its steps: `server.STATE_WAIT_SECS`).
STATUS_TIMEOUT_SECS = 5.0
STATE_TIMEOUT_SECS = 90.0


class PbtStateError(ValueError):
    """A file or a peer's answer that population-based training cannot use (one line)."""


class Population:
    """One learner's part in population-based training among the run's policies."""

    def __init__(
        self,
        config: LearnerJobConfig,
        trainer: Trainer,
        variables: Sequence[tf.Variable],
        run_dir: str,
        is_chief: bool,
        report: Callable[[str], None],
        secret: str,
        tls=None,
    ):
        """Args:
        variables: everything a copy carries, in a fixed order: the network's variables, then
          the optimiser's.
        run_dir: the policy's folder ('' without one: nothing is kept or logged).
        """
        self._pbt = config.pbt
        self._policy = config.policy_index
        self._seed = config.game.seed
        self._trainer = trainer
        self._variables = list(variables)
        slots = {slot.ref() for slot in nonnegative_slots(trainer.optimizer)}
        self._nonnegative = frozenset(
            index for index, variable in enumerate(self._variables) if variable.ref() in slots
        )
        self._run_dir = run_dir
        self._checkpoint_dir = os.path.join(run_dir, run_folder.CHECKPOINTS) if run_dir else ""
        self._is_chief = is_chief
        self._report = report
        self._returns: collections.deque[float] = collections.deque(
            maxlen=config.pbt.objective_games
        )
        self.next_look = max(config.pbt.start_frames, config.pbt.period_frames)
        self.generation = 0
        self._peers: dict[int, PolicyPeer] = {}
        if is_chief:
            limit = wire.STATE_HEADER.size + wire.MAX_STATE_HEADER_BYTES + _state_bytes(variables)
            self._peers = {
                policy: PolicyPeer(address, secret, limit, tls)
                for policy, address in enumerate(config.policy_hosts)
                if policy != self._policy
            }

    # ---- Across restarts ----------------------------------------------------------------------

    def restore(self, checkpoint: str | None) -> None:
        """Takes the hyperparameters, next look and copies kept for `checkpoint` (the one the
        learners resumed from; None: a new run keeps the config's), on every learner.

        Raises:
          PbtStateError: the state file is damaged (one line naming it).
        """
        entry = None
        if checkpoint and self._is_chief:
            entry = _read_state(self._checkpoint_dir).get(os.path.basename(checkpoint))
            if entry is None:
                self._report(
                    f"pbt: {os.path.join(self._checkpoint_dir, STATE_FILE)} has no entry for "
                    f"{checkpoint}; going on with the flags' hyperparameters"
                )
        entry = allreduce.broadcast_object_from_chief(entry)
        initial = self._pbt.initial(self._policy)
        if not checkpoint and initial:
            self._trainer.set_hyperparameters(**initial)
            self._report(f"pbt: policy {self._policy} starts with {_describe(initial)}")
        if entry:
            self._trainer.set_hyperparameters(**entry["hyperparameters"])
            self.next_look, self.generation = entry["next_look"], entry["generation"]
            self._returns.extend(entry.get("returns", ()))
            self._report(
                f"pbt: resumed with {_describe(entry['hyperparameters'])}, {self.generation} "
                f"copies so far, {len(self._returns)} games for its ranking, next look at "
                f"{self.next_look} frames"
            )

    def before_save(self, version: int) -> None:
        """Records, for the checkpoint about to be written at weight `version`, what a resume
        from it must take (rank 0 with a run folder, before the checkpoint is written)."""
        checkpoint_dir = self._checkpoint_dir
        new = os.path.basename(checkpoints.path_of(checkpoint_dir, version))
        kept, _ = checkpoints.listed(checkpoint_dir)
        # Oldest first; without the new one, listed already if a save at this version was
        # written before (the last save of a run that stops just after a periodic one).
        names = [os.path.basename(path) for path in kept if os.path.basename(path) != new]
        try:
            earlier = _read_state(checkpoint_dir)
        except PbtStateError as error:
            problem = str(error).removesuffix(_REMEDY)
            self._report(f"pbt: {problem}; writing it again with this checkpoint's entry only")
            earlier = {}
        entries = {name: dict(earlier[name]) for name in names if name in earlier}
        for name in names[: max(len(names) - (ENTRIES_WITH_RETURNS - 1), 0)]:
            entries.get(name, {}).pop("returns", None)
        entries[new] = {
            "hyperparameters": self._hyperparameters(),
            "next_look": self.next_look,
            "generation": self.generation,
            "returns": list(self._returns),  # a resume's first look ranks it on them
        }
        os.makedirs(checkpoint_dir, exist_ok=True)
        # On disk before the checkpoint it is for: a resume from that checkpoint needs it.
        checkpoint_folder.write_durably(
            checkpoint_dir, STATE_FILE, json.dumps(entries, indent=2, sort_keys=True) + "\n"
        )

    # ---- Every step ---------------------------------------------------------------------------

    def record(self, returns: np.ndarray) -> None:
        """Adds this policy's games finished since the last step."""
        self._returns.extend(float(value) for value in returns)

    def status(self, frames: int) -> pbt.Status:
        return pbt.Status(
            policy=self._policy,
            frames=frames,
            games=len(self._returns),
            objective=pbt.objective(self._returns, self._pbt.objective_games),
            hyperparameters=self._hyperparameters(),
            generation=self.generation,
        )

    def serve(self, service, frames: int) -> None:
        """Rank 0: publishes this policy's status, and a snapshot of its state if asked."""
        service.publish_status(self.status(frames).encode())
        if service.state_wanted:
            service.publish_state(self._encode_state(frames))

    def due(self, frames: int) -> bool:
        return frames >= self.next_look

    # ---- A look -------------------------------------------------------------------------------

    def look(
        self, frames: int, summaries=None, check: Callable[[], str | None] | None = None
    ) -> bool:
        """Every learner of the policy, at the same step: decides (rank 0) and applies the
        decision. Returns whether the weights changed (a copy).

        Args:
          check: what, with the weights as they are, this policy's actors would send that its
            learners refuse (`steps.outputs_out_of_bounds` on the last batch), or None if
            nothing: a donor's state that fails it is not kept.
        """
        decision, hyperparameters, note = None, None, {}
        if self._is_chief:
            decision, hyperparameters, note = self._decide(frames, check)
        decision, hyperparameters = allreduce.broadcast_object_from_chief(
            (decision, hyperparameters)
        )
        copied = decision.action == pbt.REPLACE
        if copied:
            allreduce.broadcast_from_chief(self._variables)
            self._returns.clear()
            self.generation += 1
        before = self._hyperparameters()
        self._trainer.set_hyperparameters(**hyperparameters)
        self.next_look = frames + self._pbt.period_frames
        if self._is_chief:
            self._log(frames, decision, before, note, summaries)
        return copied

    def _decide(
        self, frames: int, check: Callable[[], str | None] | None = None
    ) -> tuple[pbt.Decision, dict[str, float], dict]:
        """Rank 0: the decision and the hyperparameters to go on with."""
        me = self.status(frames)
        others = []
        for policy, peer in self._peers.items():
            answer = peer.status(STATUS_TIMEOUT_SECS)
            status = pbt.Status.decode(answer, policy) if answer is not None else None
            if status is not None:
                others.append(status)
        rng = random.Random(f"{self._seed}/{self._policy}/{frames}")
        decision = pbt.decide(me, others, self._pbt, rng)
        note = {"objective": me.objective, "games": me.games, "answered": len(others)}
        hyperparameters = dict(me.hyperparameters)
        if decision.action == pbt.REPLACE:
            try:
                donor = self._copy(decision.donor, check)
            except PbtStateError as error:
                decision = pbt.Decision(pbt.SIT_OUT, str(error), ranking=decision.ranking)
            else:
                hyperparameters = donor["hyperparameters"]
                note |= {"donor_frames": donor["frames"], "donor_generation": donor["generation"]}
        if decision.action in (pbt.MUTATE, pbt.REPLACE):
            hyperparameters = pbt.perturb(hyperparameters, self._pbt, rng)
        return decision, hyperparameters, note

    def _copy(self, donor: int, check: Callable[[], str | None] | None = None) -> dict:
        """Rank 0: assigns policy `donor`'s state to this learner's variables; returns its
        header. Raises PbtStateError (the variables as they were) if it did not come or is
        unusable: among that, weights whose outputs `check` finds its actors' chunks would be
        refused for (the learners would wait for a batch that never comes, and never look
        again)."""
        started = time.monotonic()
        peer = self._peers[donor]
        answer = peer.state(STATE_TIMEOUT_SECS)
        if answer is None and peer.last_failure:
            raise PbtStateError(f"policy {donor} did not give its state ({peer.last_failure})")
        if answer is None:
            waited = time.monotonic() - started
            if waited < STATE_TIMEOUT_SECS - 1:
                raise PbtStateError(
                    f"policy {donor} answered in {waited:.1f} s without its state (it lets "
                    f"{MAX_STATE_WAITERS} copies wait at once, or was not in the population "
                    "yet, or is gone)"
                )
            raise PbtStateError(
                f"policy {donor}'s state did not come within {STATE_TIMEOUT_SECS:.0f} s"
            )
        header, arrays = decode_state(answer, donor, self._variables, self._nonnegative)
        kept = [variable.numpy() for variable in self._variables] if check else []
        for variable, values in zip(self._variables, arrays, strict=True):
            variable.assign(values)
        problem = "its outputs were not checked"  # until `check` returns
        try:
            problem = check() if check else None
        except tf.errors.OpError as error:
            problem = f"its outputs could not be checked ({type(error).__name__})"
        finally:
            if problem:  # whatever `check` raised too
                for variable, values in zip(self._variables, kept, strict=True):
                    variable.assign(values)
        if problem:
            raise PbtStateError(f"policy {donor}'s state is not kept: {problem}")
        self._report(
            f"pbt: copied policy {donor}'s state ({len(answer) / 2**20:.1f} MiB, "
            f"{time.monotonic() - started:.1f} s)"
        )
        return header

    def _log(self, frames, decision: pbt.Decision, before, note, summaries) -> None:
        after = self._hyperparameters()
        line = {
            "time": time.time(),
            "frames": frames,
            "policy": self._policy,
            "action": decision.action,
            "donor": decision.donor,
            "why": decision.why,
            "ranking": list(decision.ranking),
            "generation": self.generation,
            "hyperparameters_before": before,
            "hyperparameters": after,
            **note,
        }
        if self._run_dir:
            _append_line(os.path.join(self._run_dir, LOG_FILE), json.dumps(line), self._report)
        donor = f" policy {decision.donor}" if decision.donor is not None else ""
        self._report(
            f"pbt: look at {frames} frames: {decision.action}{donor} ({decision.why}); "
            f"{_describe(after)}"
        )
        if summaries:
            objective = note.get("objective")
            summaries.pbt(
                frames,
                {
                    **after,
                    "generation": self.generation,
                    "copied_from": -1 if decision.donor is None else decision.donor,
                    **({"objective": objective} if objective is not None else {}),
                },
            )

    def _hyperparameters(self) -> dict[str, float]:
        values = dataclasses.asdict(self._trainer.hyperparameters)
        return {name: float(values[name]) for name in pbt.TUNED}

    def _encode_state(self, frames: int) -> bytes:
        header = {
            "policy": self._policy,
            "frames": frames,
            "generation": self.generation,
            "hyperparameters": self._hyperparameters(),
            "variables": [[list(v.shape), v.dtype.name] for v in self._variables],
        }
        encoded = json.dumps(header).encode()
        body = b"".join(_little_endian(v.numpy()).tobytes() for v in self._variables)
        return wire.STATE_HEADER.pack(len(encoded)) + encoded + body

    def close(self) -> None:
        for peer in self._peers.values():
            peer.close()


def decode_state(
    data: bytes, donor: int, variables: Sequence[tf.Variable], nonnegative: Collection[int] = ()
) -> tuple[dict, list[np.ndarray]]:
    """The header and the values of a `PolicyState` answer from policy `donor`, checked against
    `variables`: the same shapes and dtypes, finite floats, integers within +-2^53, and no
    negative value in the variables at the indices `nonnegative` (the optimiser slots a step
    takes the square root of: finite but negative, they would make the next step's weights NaN).

    Raises:
      PbtStateError: one line saying what is wrong; nothing was assigned.
    """
    where = f"policy {donor}'s state"
    if len(data) < wire.STATE_HEADER.size:
        raise PbtStateError(f"{where}: {len(data)} bytes, too short for its header")
    (size,) = wire.STATE_HEADER.unpack_from(data)
    if size > min(wire.MAX_STATE_HEADER_BYTES, len(data) - wire.STATE_HEADER.size):
        raise PbtStateError(f"{where}: a header of {size} bytes does not fit")
    try:
        header = json.loads(data[wire.STATE_HEADER.size : wire.STATE_HEADER.size + size].decode())
        expected = [[list(v.shape), v.dtype.name] for v in variables]
        sound = (
            isinstance(header, dict)
            and header.get("policy") == donor
            and header.get("variables") == expected
            and pbt.hyperparameters_are_sound(header.get("hyperparameters"))
            and all(pbt.is_count(header.get(k)) for k in ("frames", "generation"))
        )
    # RecursionError: JSON nested deeper than the parser goes, which fits in a header.
    except (ValueError, UnicodeDecodeError, RecursionError):
        sound = False
    if not sound:
        raise PbtStateError(f"{where}: its header does not describe this policy's variables")
    offset, arrays = wire.STATE_HEADER.size + size, []
    for index, variable in enumerate(variables):
        dtype = np.dtype(variable.dtype.as_numpy_dtype).newbyteorder("<")
        count = math.prod(variable.shape)
        end = offset + count * dtype.itemsize
        if end > len(data):
            raise PbtStateError(f"{where}: {len(data)} bytes, fewer than its variables take")
        values = np.frombuffer(data, dtype, count, offset).reshape(variable.shape)
        if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
            raise PbtStateError(f"{where}: holds values that are not finite")
        if values.dtype.kind in "iu" and _beyond(values, pbt.MAX_JSON_INT):
            raise PbtStateError(f"{where}: {variable.name} holds integers beyond +-2^53")
        if index in nonnegative and values.size and values.min() < 0:
            raise PbtStateError(
                f"{where}: {variable.name} holds negative values, where the optimiser takes a "
                "square root"
            )
        arrays.append(values.astype(dtype.newbyteorder("=")))
        offset = end
    if offset != len(data):
        raise PbtStateError(f"{where}: {len(data) - offset} bytes more than its variables take")
    return header, arrays


def _beyond(values: np.ndarray, bound: int) -> bool:
    return bool(values.size) and (values.max() > bound or values.min() < -bound)


def _little_endian(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, values.dtype.newbyteorder("<"))


def _state_bytes(variables: Sequence[tf.Variable]) -> int:
    return sum(math.prod(v.shape) * v.dtype.size for v in variables)


def _append_line(path: str, line: str, report: Callable[[str], None]) -> None:
    """Appends `line` to the log at `path` in one write, only to a regular file and never
    through a link; a log that cannot be written (a full disk, a FIFO planted at its name) is
    reported, and training goes on."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as error:
        report(f"pbt: cannot write {path} ({error.strerror or error}); this look is not logged")


def _describe(hyperparameters) -> str:
    """`learning_rate 0.001, entropy_cost 0.01`: the tuned ones given, in `TUNED`'s order."""
    return ", ".join(
        f"{name} {hyperparameters[name]:.3g}" for name in pbt.TUNED if name in hyperparameters
    )


def _read_state(checkpoint_dir: str) -> dict[str, dict]:
    """The entries of `pbt_state.json` ({} if there is none).

    Raises:
      PbtStateError: one line naming the file, if it is not what this module writes (a
        resume stops on it; a save reports it and writes the file again).
    """
    path = os.path.join(checkpoint_dir, STATE_FILE)
    try:
        entries = run_folder.read_json(path, MAX_STATE_FILE_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except ValueError as error:
        raise PbtStateError(f"{error}{_REMEDY}") from None
    if isinstance(entries, dict) and all(_is_entry(entry) for entry in entries.values()):
        return entries
    raise PbtStateError(f"{path}: not population-based training's state file{_REMEDY}")


def _is_entry(entry: object) -> bool:
    """Whether `entry` is one `before_save` writes (without `returns`: older than the newest
    `ENTRIES_WITH_RETURNS`, or written before 2026-12-07)."""
    return (
        isinstance(entry, dict)
        and set(entry) - {"returns"} == {"hyperparameters", "next_look", "generation"}
        and pbt.hyperparameters_are_sound(entry["hyperparameters"])
        and all(pbt.is_count(entry[k]) for k in ("next_look", "generation"))
        and isinstance(entry.get("returns", []), list)
        and all(pbt.is_finite(value) for value in entry.get("returns", []))
    )
