"""A multi-host run as its plan sees it: the learners in rank order, the actors, the flags every
process gets and the run's folder."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Sequence

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
    """

    learners: tuple[Worker, ...]
    actors: tuple[Worker, ...]
    flags: tuple[str, ...]
    run_name: str
    logdir: str

    @classmethod
    def of(
        cls, workers: Sequence[Worker], flags: Sequence[str], run_name: str, logdir: str
    ) -> RunLayout:
        actors = tuple(w for w in workers if w.job == "actor")
        return cls(tuple(learner_ranks(workers)), actors, tuple(flags), run_name, logdir)

    @property
    def learner_hosts(self) -> list[str]:
        """The learners' addresses, in rank order: --learner_hosts of every process."""
        return [w.address for w in self.learners]

    @property
    def actor_hosts(self) -> list[str]:
        """--actor_hosts of every process."""
        return [w.host for w in self.actors]

    @property
    def log_dir(self) -> str:
        """The run folder, relative to each host's workdir unless absolute."""
        return posixpath.join(self.logdir, self.run_name)

    @property
    def run_flags(self) -> list[str]:
        """The flags of a bare process: the hyperparameters and the run folder."""
        return [*self.flags, f"--logdir={self.logdir}", f"--experiment={self.run_name}"]

    def container_flags(self, worker: Worker) -> list[str]:
        """The flags of a process in a container: the hyperparameters and the host's run
        folder, at the same path inside (the container's own folder is the image's, not the
        CSV's workdir)."""
        run_folder = posixpath.join(worker.workdir, self.logdir)
        return [*self.flags, f"--logdir={run_folder}", f"--experiment={self.run_name}"]

    def workdir_on(self, host: str) -> str:
        """The workdir of the first learner on `host`."""
        return next(w.workdir for w in self.learners if w.host == host)
