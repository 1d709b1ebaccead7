"""Fault injection: a `run_local.py` run whose actors are killed again and again (SIGKILL) and one
of whose learners is killed once, with the figures that say how the run coped.

  python -m benchmarks.faults                                   # 60 actor kills, 1 learner kill
  python -m benchmarks.faults --actor_kills=50 --out=runs/faults.json

Kills follow the training: the k-th of N actor kills comes once the run has passed
0.9 k / (N + 1) of its frame budget (an actor that has run for `--min_actor_age_secs` is
chosen at random), and the learner kill (rank `--learner_rank`, right after a progress line)
once it has passed half. So every kill lands while the run trains, however fast this machine
is. Printed at the end, and written as JSON with `--out`:

- kills survived, restarts of actors and learners (from run_local.py's own lines);
- frames lost at the learner kill: the frames of its last progress line minus those of the
  checkpoint the restarted learners resumed from, against one save interval's frames;
- time to recover: from the learner kill to the first progress line of the restarted learners,
  and from each actor kill to that actor's next "acting for learner" line;
- whether the run reached its budget with every learner holding identical weights.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

from absl import app, flags

from benchmarks import fault_logs, run_processes
from impala import run_folder

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
flags.DEFINE_integer("actor_kills", 60, "Actor kills over the run.", lower_bound=1)
flags.DEFINE_integer("learner_rank", 1, "Which learner is killed once (its mpirun rank).")
flags.DEFINE_integer("num_learners", 2, "Learners, under mpirun.", lower_bound=1)
flags.DEFINE_integer("num_actors", 4, "Actors.", lower_bound=1)
flags.DEFINE_float("frames", 400_000, "The run's frame budget.", lower_bound=1)
flags.DEFINE_float("save_every_secs", 10.0, "The learners' save interval.", lower_bound=0.1)
flags.DEFINE_float(
    "min_actor_age_secs", 2.0, "Only actors alive this long are killed.", lower_bound=0
)
flags.DEFINE_float("timeout_secs", 1200.0, "Give up (and stop the run) after this long.")
flags.DEFINE_string("logdir", "", "Holds the run folder (default: runs/).")
flags.DEFINE_string("out", "", "Also write the figures to this JSON file.")
flags.DEFINE_multi_string("extra", [], "More run_local.py flags, e.g. --extra=--seed=1.")

# The run: a cheap environment and network, so that the figures are about the faults.
RUN_FLAGS = (
    "--level_name=impala/Counter-v0",
    "--agent_name=MLPAgent",
    "--unroll_length=10",
    "--batch_size=8",
    "--num_envs_per_actor=4",
    "--max_actor_restarts=100000",
    "--restart_max_delay_secs=2",
)


def _processes(experiment: str, job: str) -> list[int]:
    """PIDs of the run's `experiment.py --job_name=job` processes."""
    return run_processes.experiment_pids(job, f"--experiment={experiment}")


def _age_secs(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _rank(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    for entry in environ:
        if entry.startswith("OMPI_COMM_WORLD_RANK="):
            return int(entry.split("=", 1)[1])
    return 0 if FLAGS.num_learners == 1 else None


def _task(pid: int) -> int:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().decode(errors="replace").split("\0")
    return int(next(a for a in argv if a.startswith("--task=")).split("=", 1)[1])


class _Run:
    """run_local.py, started and watched."""

    def __init__(self, logdir: str, experiment: str, frames: int):
        self.experiment = experiment
        self.run_dir = run_folder.path(logdir, experiment)
        self.frames = frames
        argv = [
            sys.executable,
            "run_local.py",
            f"--logdir={logdir}",
            f"--experiment={experiment}",
            f"--num_learners={FLAGS.num_learners}",
            f"--num_actors={FLAGS.num_actors}",
            f"--total_environment_frames={frames}",
            f"--save_every_secs={FLAGS.save_every_secs}",
            f"--max_learner_restarts={FLAGS.num_learners}",
            *RUN_FLAGS,
            *FLAGS.extra,
        ]
        self.output_path = os.path.join(logdir, f"{experiment}.out")
        self._output = open(self.output_path, "w")  # noqa: SIM115  (closed in `wait`)
        self.popen = subprocess.Popen(
            argv, cwd=_ROOT, stdout=self._output, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        return fault_logs.read(os.path.join(self.run_dir, "learners.log"))

    def frames_done(self) -> int:
        counts = fault_logs.progress_frames(self.log())
        return counts[-1] if counts else 0

    def running(self) -> bool:
        return self.popen.poll() is None

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        finally:
            self._output.close()

    def stop(self) -> None:
        if self.running():
            os.killpg(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)


def _kill_an_actor(run: _Run, rng: random.Random) -> tuple[int, float] | None:
    """SIGKILLs a random actor alive long enough; returns (task, time) or None if none is."""
    candidates = []
    for pid in _processes(run.experiment, "actor"):
        try:
            if _age_secs(pid) >= FLAGS.min_actor_age_secs:
                candidates.append(pid)
        except (OSError, IndexError):
            continue
    if not candidates:
        return None
    pid = rng.choice(candidates)
    try:
        task = _task(pid)
        os.kill(pid, signal.SIGKILL)
    except (OSError, StopIteration):
        return None
    return task, time.monotonic()


def _kill_the_learner(run: _Run) -> tuple[float, int] | None:
    """SIGKILLs learner rank `--learner_rank` right after a progress line; returns (time,
    frames of that line) or None if it is not running."""
    lines = len(fault_logs.progress_frames(run.log()))
    deadline = time.monotonic() + 30
    while len(fault_logs.progress_frames(run.log())) == lines and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in _processes(run.experiment, "learner"):
        if _rank(pid) == FLAGS.learner_rank:
            os.kill(pid, signal.SIGKILL)
            return time.monotonic(), fault_logs.frames_logged(run.log())
    return None


def _actor_recoveries(
    run: _Run, kills: list[tuple[int, float]], ended: float
) -> tuple[list[float], list[float]]:
    """Seconds from each actor kill to that actor acting again (its next 'acting' line), and
    for the kills after which it never did, seconds from the kill to the end of the training:
    the learners' "done" line (whole seconds), else `ended`. Not run_local.py's exit, which
    comes up to its stop timeout later when an actor started again waits for a learner that
    has finished."""
    done = fault_logs.DONE.findall(run.log())
    finished = fault_logs.seconds_of_day(done[-1]) if done else fault_logs.clock(ended)
    recoveries, silent = [], []
    for task, when in kills:
        acting = [
            fault_logs.seconds_of_day(line[:8])
            for line in fault_logs.read(os.path.join(run.run_dir, f"actor_{task}.log")).splitlines()
            if "acting for learner" in line and re.match(r"\d\d:\d\d:\d\d", line)
        ]
        killed = fault_logs.clock(when)
        after = [t - killed for t in acting if t - killed >= 0]
        if after:
            recoveries.append(min(after))
        else:
            silent.append(finished - killed)
    return recoveries, silent


# Actor kills are spread over this share of the budget: the last one's restart (after at most
# --restart_max_delay_secs) then comes well before the run ends. Spread over all of it, the last
# kill came 2% before the end, and the run could finish before that actor started again.
_KILLS_WITHIN = 0.9


def inject(logdir: str, experiment: str) -> dict:
    """Runs the fault injection; returns its figures."""
    frames = int(FLAGS.frames)
    rng = random.Random(0)
    run = _Run(logdir, experiment, frames)
    deadline = time.monotonic() + FLAGS.timeout_secs
    actor_kills: list[tuple[int, float]] = []
    learner_kill: tuple[float, int] | None = None
    try:
        while run.running() and time.monotonic() < deadline:
            done = run.frames_done()
            if learner_kill is None and done >= frames / 2:
                learner_kill = _kill_the_learner(run)
            elif len(actor_kills) < FLAGS.actor_kills and done >= (
                (len(actor_kills) + 1) * _KILLS_WITHIN * frames / (FLAGS.actor_kills + 1)
            ):
                kill = _kill_an_actor(run, rng)
                if kill:
                    actor_kills.append(kill)
            time.sleep(0.1)
        code = run.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        code = None
    finally:
        run.stop()
    return _figures(run, code, actor_kills, learner_kill, ended=time.monotonic())


def _figures(run, code, actor_kills, learner_kill, ended: float) -> dict:
    output, log = fault_logs.read(run.output_path), run.log()
    summaries = [
        json.loads(fault_logs.read(os.path.join(run.run_dir, f"learner_{rank}.json")) or "null")
        for rank in range(FLAGS.num_learners)
    ]
    figures = {
        "run_dir": run.run_dir,
        "exit_code": code,
        "budget": run.frames,
        "actor_kills": len(actor_kills),
        "actor_restarts": len(re.findall(r"\[run_local\] actor \d+ started again", output)),
        "actors_given_up": len(re.findall(r"not restarting it", output)),
        "learner_kills": int(learner_kill is not None),
        "learner_restarts": len(
            re.findall(r"the learners exited with code .*; restarting", output)
        ),
        "frames": [s and s["frames"] for s in summaries],
        "budget_reached": all(s and s["frames"] >= run.frames for s in summaries),
        "learners_identical": len({s and s["weights_sha256"] for s in summaries}) == 1,
    }
    # An actor killed near the end may not start and act again before the budget is reached.
    figures["actor_recovery_secs"], figures["actor_silent_until_end_secs"] = _actor_recoveries(
        run, actor_kills, ended
    )
    resumed = fault_logs.RESUMED.findall(log)
    if learner_kill is not None and resumed:
        killed_at, frames_at_kill = learner_kill
        resumed_frames = int(resumed[-1][1])
        figures["frames_at_learner_kill"] = frames_at_kill
        figures["frames_resumed_from"] = resumed_frames
        figures["frames_lost"] = frames_at_kill - resumed_frames
        before = fault_logs.progress_frames(log[: log.index(resumed[-1][0])])
        figures["frames_per_save_interval"] = (
            fault_logs.rate_before_kill(log, before) * FLAGS.save_every_secs
        )
        figures["training_secs_lost"] = fault_logs.secs_lost(log, resumed_frames, killed_at)
        figures["save_every_secs"] = FLAGS.save_every_secs
        figures["learner_recovery_secs"] = fault_logs.learner_recovery(log, killed_at)
    return figures


def report(figures: dict) -> None:
    recoveries = figures["actor_recovery_secs"]
    print(
        f"[faults] actor kills survived: {figures['actor_kills']} (restarts "
        f"{figures['actor_restarts']}, given up {figures['actors_given_up']}); learner kills: "
        f"{figures['learner_kills']} (learners restarted {figures['learner_restarts']}x)"
    )
    if "frames_lost" in figures:
        print(
            f"[faults] learner killed at {figures['frames_at_learner_kill']:,} frames, resumed "
            f"from {figures['frames_resumed_from']:,}: {figures['frames_lost']:,} frames lost, "
            f"{figures['training_secs_lost']} s of training (one save interval: "
            f"{figures['save_every_secs']:g} s, {figures['frames_per_save_interval']:,.0f} frames)"
        )
        print(
            f"[faults] recovery: learners trained again {figures['learner_recovery_secs']} s "
            "after the kill; actors acted again "
            + (
                f"{sum(recoveries) / len(recoveries):.1f} s (mean), {max(recoveries)} s (max)"
                if recoveries
                else "(no actor log line found)"
            )
            + " after theirs"
            + "".join(
                f"; an actor killed {secs:g} s before the learners finished did not act again"
                for secs in figures["actor_silent_until_end_secs"]
            )
        )
    print(
        f"[faults] budget {figures['budget']:,} frames "
        f"{'reached' if figures['budget_reached'] else 'NOT reached'} "
        f"(learners at {figures['frames']}); learners "
        f"{'identical' if figures['learners_identical'] else 'DIFFER'}; exit code "
        f"{figures['exit_code']}; run folder {figures['run_dir']}"
    )


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logdir = os.path.abspath(FLAGS.logdir or os.path.join(_ROOT, "runs"))
    os.makedirs(logdir, exist_ok=True)
    experiment = f"faults-{time.strftime('%Y%m%d-%H%M%S')}"
    figures = inject(logdir, experiment)
    report(figures)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            json.dump(figures, f, indent=2)
    ok = (
        figures["exit_code"] == 0
        and figures["budget_reached"]
        and figures["learners_identical"]
        and figures["actor_kills"] >= FLAGS.actor_kills
        and figures["learner_kills"] == 1
    )
    return 0 if ok else 1


if __name__ == "__main__":
    app.run(main)
