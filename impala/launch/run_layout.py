"""A multi-host run as its plan sees it: the learners in rank order, the actors, the flags every
process gets and the run's folder; with several policies (`--num_policies`), one layout per
policy (`policy_layouts`)."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence

from impala import run_folder
from impala.launch.tmux import LEARNERS_WINDOW
from impala.launch.workers_csv import Worker


def learner_ranks(workers: Sequence[Worker]) -> list[Worker]:
    """Learners in rank order: mpirun fills each host's slots before the next host's, so ranks
    are grouped by host, hosts in the order they first appear in the CSV."""
    learners = [w for w in workers if w.job == "learner"]
    first_seen = {}
    for worker in learners:
        first_seen.setdefault(worker.host, len(first_seen))
    return sorted(learners, key=lambda w: (first_seen[w.host], w.line))


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """Who runs in a run, with which flags, and where it keeps its files.

    Attributes:
      learners: the learners' CSV rows, in rank order (`learner_ranks`).
      actors: the actors' CSV rows, in CSV order.
      flags: the hyperparameter flags every process gets.
      run_name: names the run's folder and its tmux sessions.
      logdir: the folder of run folders, relative to each host's workdir unless absolute.
      policy: in a run of several policies, the one these processes train or play for (their
        `--policy`); None in a run of one.
      policy_hosts: in a run of several policies, the rank-0 learner of each, in policy order
        (the learners' `--policy_hosts`).
      run_learner_hosts: in a run of several policies, every learner of every policy (the
        learners' `--run_learner_hosts`).
    """

    learners: tuple[Worker, ...]
    actors: tuple[Worker, ...]
    flags: tuple[str, ...]
    run_name: str
    logdir: str
    policy: int | None = None
    policy_hosts: tuple[str, ...] = ()
    run_learner_hosts: tuple[str, ...] = ()

    @property
    def learner_hosts(self) -> list[str]:
        """The learners' addresses, in rank order: --learner_hosts of every process."""
        return [w.address for w in self.learners]

    @property
    def actor_hosts(self) -> list[str]:
        """--actor_hosts of every process."""
        return [w.host for w in self.actors]

    @property
    def run_dir(self) -> str:
        """The run folder, relative to each host's workdir unless absolute: the run secret and
        TLS bundle live there, for every policy."""
        return posixpath.join(self.logdir, self.run_name)

    @property
    def log_dir(self) -> str:
        """The folder of these processes' logs and files, relative to each host's workdir unless
        absolute: the run folder, or in a run of several policies this policy's folder in it."""
        if self.policy is None:
            return self.run_dir
        return posixpath.join(self.run_dir, f"{run_folder.POLICY_PREFIX}{self.policy}")

    @property
    def run_flags(self) -> list[str]:
        """The flags of a bare process: the hyperparameters, the run folder and the policy."""
        return [*self.flags, f"--logdir={self.logdir}", *self._own_flags]

    @property
    def learner_flags(self) -> list[str]:
        """The flags of a bare learner: `run_flags`, and where the other policies' learners
        are."""
        return [*self.run_flags, *self._population_flags]

    def container_flags(self, worker: Worker, learner: bool = False) -> list[str]:
        """The flags of a process in a container: the hyperparameters and the host's run
        folder, at the same path inside (the container's own folder is the image's, not the
        CSV's workdir), and the policy."""
        logdir = posixpath.join(worker.workdir, self.logdir)
        population = self._population_flags if learner else []
        return [*self.flags, f"--logdir={logdir}", *self._own_flags, *population]

    @property
    def _own_flags(self) -> list[str]:
        policy = [] if self.policy is None else [f"--policy={self.policy}"]
        return [f"--experiment={self.run_name}", *policy]

    @property
    def _population_flags(self) -> list[str]:
        flags = [f"--policy_hosts={','.join(self.policy_hosts)}"] if self.policy_hosts else []
        if self.run_learner_hosts:
            flags.append(f"--run_learner_hosts={','.join(self.run_learner_hosts)}")
        return flags

    @property
    def learners_window(self) -> str:
        """The tmux window of these learners (the learner alone, or their mpirun): `learners`,
        or `policy_<k>_learners`."""
        return window_name(LEARNERS_WINDOW, self.policy)

    def actor_window(self, actor: Worker) -> str:
        """The tmux window of `actor`: `actor_<task>`, or `policy_<k>_actor_<task>`."""
        return window_name(actor.name, self.policy)

    def workdir_on(self, host: str) -> str:
        """The workdir of the first learner on `host`."""
        return next(w.workdir for w in self.learners if w.host == host)


def window_name(process: str, policy: int | None) -> str:
    """A process's tmux window, unique in its host's session: its name, after its policy's in a
    run of several."""
    return process if policy is None else f"{run_folder.POLICY_PREFIX}{policy}_{process}"


def policy_layouts(
    workers: Sequence[Worker],
    flags: Sequence[str],
    run_name: str,
    logdir: str,
    num_policies: int = 1,
    source: str = "the workers CSV",
) -> list[RunLayout]:
    """The run's layout of each policy, in policy order: one layout of every worker for a run of
    one policy.

    With the CSV's `policy` column each row names its policy. Without it, the learners (in rank
    order) are split into `num_policies` contiguous blocks, as even as they can be (the first
    blocks one learner larger), and actor i (in CSV order) plays for policy i mod
    `num_policies`. Within a policy learners are ranked and actors numbered afresh: each
    policy's processes see only their own (`--learner_hosts`, `--actor_hosts`, `--task`).

    Raises:
      ValueError: a policy out of range, or one without a learner or an actor (naming `source`
        and the line).
    """
    learners = learner_ranks(workers)
    actors = [w for w in workers if w.job == "actor"]
    if any(w.policy is not None for w in workers):
        for worker in workers:
            if worker.policy >= num_policies:
                raise ValueError(
                    f"{source}:{worker.line}: policy={worker.policy}: out of range for "
                    f"--num_policies={num_policies} (policies 0-{num_policies - 1})"
                )
        learners_of = [[w for w in learners if w.policy == k] for k in range(num_policies)]
        actors_of = [[w for w in actors if w.policy == k] for k in range(num_policies)]
    else:
        for job, rows in (("learner", learners), ("actor", actors)):
            if len(rows) < num_policies:
                raise ValueError(
                    f"{source}: {len(rows)} {job} row(s) for --num_policies={num_policies}: "
                    f"every policy needs a {job}"
                )
        size, larger = divmod(len(learners), num_policies)
        starts = [k * size + min(k, larger) for k in range(num_policies + 1)]
        learners_of = [learners[starts[k] : starts[k + 1]] for k in range(num_policies)]
        actors_of = [actors[k::num_policies] for k in range(num_policies)]
    for policy in range(num_policies):
        for job, rows in (("learner", learners_of[policy]), ("actor", actors_of[policy])):
            if not rows:
                raise ValueError(
                    f"{source}: no {job} row names policy={policy}; every one of "
                    f"--num_policies={num_policies} needs a learner and an actor"
                )
    if num_policies == 1:
        return [RunLayout(tuple(learners), tuple(actors), tuple(flags), run_name, logdir)]
    chiefs = tuple(learner_ranks(rows)[0].address for rows in learners_of)
    everyone = tuple(worker.address for rows in learners_of for worker in learner_ranks(rows))
    return [
        RunLayout(
            tuple(_numbered(learner_ranks(learners_of[policy]))),
            tuple(_numbered(actors_of[policy])),
            tuple(flags),
            run_name,
            logdir,
            policy=policy,
            policy_hosts=chiefs,
            run_learner_hosts=everyone,
        )
        for policy in range(num_policies)
    ]


def _numbered(workers: Sequence[Worker]) -> list[Worker]:
    """`workers` with their tasks counted afresh: rank or task within their policy (their CSV
    row keeps its line; the tmux window's name has the policy's in front)."""
    return [dataclasses.replace(worker, task=index) for index, worker in enumerate(workers)]
