"""Throughput of each stage and of the whole system, measured in one run on this machine.

  python -m benchmarks.throughput                    # the make-train set-up (Pong)
  python -m benchmarks.throughput --e2e_frames=1e6   # a longer end-to-end measurement
  python -m benchmarks.throughput --batch_reuse=1    # any experiment.py flag changes the set-up
  python -m benchmarks.throughput --num_learners=2 --num_actors=4   # 2 learners under mpirun

The set-up is experiment.py's flags: their defaults (what `make train` runs) and any given here,
which the end-to-end run is also given.

Prints, in agent steps/s and emulator frames/s:
  env        one actor's vector of environments stepped with random actions;
  inference  the policy on one actor's batch of observations;
  train      the learner on a [T + 1, B] batch: its --batch_reuse passes of
             --num_batches_per_epoch optimisation steps each, in agent steps of the batch
             consumed per second; with --replay_parameters also in new experience (the
             queue's share of the batch: a 50/50 mix trains twice the steps per new frame);
  ceiling    what a pipeline doing the three one after another on this machine could reach,
             1 / (1/env + 1/inference + 1/train), train in new experience: the
             compute-bound ceiling (an elite replay's encoding of its candidates is left
             out of it);
  end-to-end the real system (run_local.py: learner and actor processes, gRPC, queues),
             steady state after start-up (all learners' frames), and its fraction of the
             ceiling, which is one learner's: with several learners on this machine they
             share its cores;
  lag        the policy lag the learner reported along the run (learner steps between acting
             and learning), and with synchronous collection the trajectories it dropped;
  learner    where the end-to-end learner's steady-state time went: its train steps (and
             their time per batch against the train stage's alone), waiting for a full
             batch, and everything else it does between steps, and how long its threads
             waited for a core (runnable, not running: what the actors took from its steps);
  actor      where each end-to-end actor's time went: playing, fetching weights, sending,
             and waiting for room in the learner's queue; and the unrolls and chunks it sent,
             the chunks sent again (to a queue that filled while they travelled), and its
             calls asking for room;
  CPU        CPU seconds per batch (every thread) of the learner and of the actors end to
             end, against the train stage's and the env and inference stages' alone, and
             how busy that kept the machine's cores.
The stages are measured alone, each with the whole machine; end to end they share it. They
are measured before the end-to-end run and again after it, and the ratio is given against the
mean of the two ceilings and against each: a shared machine's speed drifts over the minutes of
a run, and the two ceilings show by how much.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # the stages compute as experiment.py's roles

import numpy as np
from absl import app, flags

import experiment  # its flags: the set-up measured is the one make train runs
from benchmarks import learning_figures
from benchmarks.ceiling import Stages, fresh_fraction, per_batch
from impala import configs, progress
from impala.curves import events
from impala.launch import planning

FLAGS = flags.FLAGS
flags.DEFINE_integer("num_actors", 2, "Actor processes end to end (as in make train).")
flags.DEFINE_integer(
    "num_learners",
    1,
    "Learner processes end to end (as in make train; several under mpirun).",
    lower_bound=1,
)
flags.DEFINE_float("seconds", 10.0, "How long each stage is measured.")
flags.DEFINE_float("e2e_frames", 600_000, "Frame budget of the end-to-end run.")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure_stages(config: configs.LearnerConfig, agent=None) -> tuple[Stages, object, int]:
    """The stages with experiment.py's flags; the agent (built here unless given) and the
    emulator frames per agent step."""
    # TensorFlow, only once the flags are checked: a bad one is refused in a moment.
    from benchmarks.stages import measure_env, measure_inference, measure_train
    from impala import build

    env, num_actions, shape, dtype, frames_per_step = measure_env(
        FLAGS.level_name,
        FLAGS.num_envs_per_actor,
        FLAGS.num_action_repeats,
        FLAGS.seconds,
        FLAGS.repeat_action_probability,
        FLAGS.frame_skip,
        FLAGS.frame_pooling,
    )
    agent = agent or build.agent_for(
        FLAGS.agent_name, num_actions, shape, dtype, FLAGS.compute_dtype
    )
    inference = measure_inference(agent, shape, dtype, FLAGS.num_envs_per_actor, FLAGS.seconds)
    train = measure_train(agent, shape, dtype, config, FLAGS.seconds)
    return Stages(env, inference, train), agent, frames_per_step


def measure_end_to_end(frames: float) -> dict:
    """Runs run_local.py with the make-train set-up; returns the learner's summary."""
    with tempfile.TemporaryDirectory() as runs:
        argv = [
            sys.executable,
            "run_local.py",
            f"--logdir={runs}",
            f"--num_actors={FLAGS.num_actors}",
            f"--num_learners={FLAGS.num_learners}",
            *planning.forwarded_flags(experiment.flag_values(only_given=True)),
            f"--total_environment_frames={frames}",
        ]
        subprocess.run(argv, cwd=_ROOT, check=True, stdout=subprocess.DEVNULL)
        (run_dir,) = os.listdir(runs)
        with open(os.path.join(runs, run_dir, "learner_0.json")) as f:
            summary = json.load(f)
        summary["policy_lag"] = learning_figures.policy_lag(
            events.read_scalars(os.path.join(runs, run_dir))
        )
        summary["actor_time"] = [
            actor_time(os.path.join(runs, run_dir, f"actor_{task}.log"))
            for task in range(FLAGS.num_actors)
        ]
        return summary


def actor_time(log_path: str) -> str:
    """Where an actor's time went and what it sent (`progress.actor_exit_split`), from its log."""
    try:
        with open(log_path, errors="replace") as f:
            split = progress.actor_exit_split(f.read())
    except OSError as error:
        return f"(no log: {error.strerror})"
    return split or "(its log does not say)"


def lag_text(summary: dict) -> str:
    """The end-to-end run's policy lag, and the trajectories synchronous collection dropped."""
    lag = summary["policy_lag"]
    text = (
        f"median {lag['median']:.1f}, p95 {lag['p95']:.1f}, max {lag['max']:.1f} learner steps "
        f"(over {lag['steps']} reported steps)"
        if lag
        else "not reported (no progress line was written)"
    )
    if FLAGS.col_workers_communication == "synchronous":
        text += f"; {summary['stale_trajectories']} stale trajectories dropped (rank 0)"
    return text


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if FLAGS["total_environment_frames"].present:
        raise app.UsageError("--total_environment_frames: the end-to-end budget is --e2e_frames")
    experiment.apply_preset()
    try:
        config = experiment.learner_config_from_flags()
        experiment.check_run_flags()
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    print(
        f"{FLAGS.level_name}, {FLAGS.agent_name}, {os.cpu_count()} CPUs, "
        f"{FLAGS.num_envs_per_actor} envs per actor, batch {config.batch_size} x "
        f"unroll {config.unroll_length}, {config.optimizer}, {config.batch_reuse} pass(es) of "
        f"{config.num_batches_per_epoch} optimisation step(s) per batch; end to end "
        f"{FLAGS.num_learners} learner(s) and {FLAGS.num_actors} actor(s), collection "
        f"{FLAGS.col_workers_communication}, gradients {FLAGS.grad_workers_communication}"
    )
    # Measured before and after the end-to-end run: a shared machine's speed drifts over its
    # minutes, and the two ceilings show by how much.
    before, agent, frames_per_step = measure_stages(config)
    summary = measure_end_to_end(FLAGS.e2e_frames)
    after, _, _ = measure_stages(config, agent)
    e2e = summary["frames_per_second_steady"] / frames_per_step
    fresh = fresh_fraction(FLAGS.replay_parameters, config.batch_size)
    ceilings = [before.ceiling_fresh(fresh), after.ceiling_fresh(fresh)]
    ceiling = float(np.mean(ceilings))

    def row(name, *steps_per_second):
        print(
            f"  {name:<24} "
            + " | ".join(
                f"{steps:>9,.0f} agent steps/s {steps * frames_per_step:>10,.0f} frames/s"
                for steps in steps_per_second
            )
        )

    print(f"  {'':<24} {'before the end-to-end run':<42} | after it")
    for name, field in (
        ("env (random actions)", "env"),
        ("inference", "inference"),
        ("train step", "train"),
    ):
        row(name, getattr(before, field).steps_per_second, getattr(after, field).steps_per_second)
    if fresh < 1:
        row(
            f"train step, fresh {fresh:.0%}",
            before.train.steps_per_second * fresh,
            after.train.steps_per_second * fresh,
        )
    row("ceiling 1/(sum of 1/x)", *ceilings)
    row("end to end (steady)", e2e)
    print(
        f"  end to end / ceiling      {e2e / ceiling:.2f} (against the mean of the two "
        f"ceilings; {e2e / ceilings[0]:.2f} against the one before, {e2e / ceilings[1]:.2f} "
        "against the one after)"
    )
    batch_steps = config.unroll_length * config.batch_size

    def mean(stage: str, figure: str) -> float:
        """A stage's figure, the mean of its measurements before and after."""
        return float(np.mean([getattr(getattr(s, stage), figure) for s in (before, after)]))

    alone = batch_steps / mean("train", "steps_per_second")
    print(
        "  learner end to end        "
        + progress.learner_time_line(
            summary["steady_secs"], summary["steady_steps"], summary.get("steady_core_wait_secs")
        )
        + f"; the train stage alone: {alone:.3f} s per batch"
    )
    print(f"  policy lag end to end     {lag_text(summary)}")
    for task, split in enumerate(summary["actor_time"]):
        print(f"  actor {task} end to end        {split}")
    batch = per_batch(
        config.unroll_length,
        config.batch_size,
        fresh,
        FLAGS.num_envs_per_actor,
        e2e,
        mean("train", "cpu_per_step"),
        mean("env", "cpu_per_step") + mean("inference", "cpu_per_step"),
    )
    learner_cpu = (
        summary["steady_cpu_secs"] / summary["steady_steps"] if summary["steady_steps"] else None
    )
    cpu = progress.cpu_line(
        learner_cpu,
        summary["actor_time"],
        batch.unrolls,
        batch.stage_cpu,
        batch.seconds,
        os.cpu_count() or 1,
    )
    print(f"  CPU seconds per batch     {cpu}")


if __name__ == "__main__":
    app.run(main)
