"""TensorBoard summaries of a training run, written by rank 0 into the run folder.

Every summary's step is the run's emulator frame count (all learners together), so curves of
runs with different numbers of learners or actors line up, and a resumed run continues its
curves where they stopped. Tags:

  episode/return, episode/length_frames   one point per finished game (real score, all lives)
  episode/start_frames                    the frames that game began with (Atari's no-ops and
                                          FIRE), beside its return; none where there are none
  episode/return_odd_start,               the same return again under the parity of that
  episode/return_even_start               start: a Pong policy may win one kind of game only
  progress/frames_per_sec                 emulator frames per second, all learners
  time/training_secs                      seconds spent training, continued across resumes
  loss/total, loss/policy_gradient, loss/baseline, loss/entropy
  loss/entropy_cost                       the entropy bonus's weight (--entropy_cost_anneal_frames)
  optimizer/gradient_norm, optimizer/learning_rate
  optimizer/skipped_steps                 optimisation steps skipped since this start because
                                          their loss or gradients were not finite
  policy/clipped_fraction                 steps whose importance ratio is beyond a clip's bound
                                          (V-trace's rho-bar of 1, or outside --policy_clip's range)
  actors/policy_lag                       learner steps between acting and learning, mean
  learner_<rank>/queue_fill               fraction of that learner's queue in use
  learner_<rank>/frames_received          emulator frames that learner's actors delivered
                                          since it (re)started
  weights/<variable>                      histograms, with --summary_histograms
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

# The learner's step statistics (`learner.Learner.step`) and their tags here.
_STEP_TAGS = {
    "loss/total": "loss/total",
    "loss/policy_gradient": "loss/policy_gradient",
    "loss/baseline": "loss/baseline",
    "loss/entropy": "loss/entropy",
    "gradient_norm": "optimizer/gradient_norm",
    "learning_rate": "optimizer/learning_rate",
    "entropy_cost": "loss/entropy_cost",
    "clipped_fraction": "policy/clipped_fraction",
}


_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()


def _scalar(tag: str, value: float) -> bytes:
    """The serialised summary tf.summary.scalar(tag, value) writes (a float32 tensor)."""
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_FLOAT,
        tensor_shape=_SCALAR_SHAPE,
        tensor_content=np.float32(value).tobytes(),
    )
    point = summary_pb2.Summary.Value(tag=tag, metadata=_SCALAR_METADATA, tensor=tensor)
    return summary_pb2.Summary(value=[point]).SerializeToString()


class Summaries:
    """Writes one run's TensorBoard events into `run_dir`."""

    def __init__(self, run_dir: str, histograms: bool = False):
        self._writer = tf.summary.create_file_writer(run_dir)
        self._histograms = histograms

    def episodes(
        self,
        frames: int,
        returns: np.ndarray,
        lengths_frames: np.ndarray,
        start_frames: np.ndarray | None = None,
    ) -> None:
        """One point per finished game: its score, its length in emulator frames and, where
        known (>= 0), the frames it began with."""
        if start_frames is None:
            start_frames = np.full(len(returns), -1)
        # The points tf.summary.scalar writes (tag, value and its metadata), in one event and
        # one call: a scalar op a point took 12 to 20 times the CPU (docs/throughput-history.md),
        # which games of a few steps (Catch's, Counter's) paid at every step.
        points = []
        for episode_return, length, start in zip(
            returns, lengths_frames, start_frames, strict=True
        ):
            points.append(_scalar("episode/return", episode_return))
            points.append(_scalar("episode/length_frames", length))
            if start >= 0:
                points.append(_scalar("episode/start_frames", start))
                parity = "odd" if int(start) % 2 else "even"
                points.append(_scalar(f"episode/return_{parity}_start", episode_return))
        if points:
            with self._writer.as_default(step=frames):
                tf.summary.experimental.write_raw_pb(points)

    def training(
        self,
        frames: int,
        step_stats: Mapping[str, float],
        frames_per_sec: float,
        training_secs: float,
        policy_lag: float,
        skipped_steps: int = 0,
    ) -> None:
        """The learner's state at `frames`: losses, optimiser, speed, and the optimisation steps
        skipped since this start (loss or gradients not finite)."""
        with self._writer.as_default(step=frames):
            for name, tag in _STEP_TAGS.items():
                tf.summary.scalar(tag, step_stats[name])
            tf.summary.scalar("optimizer/skipped_steps", skipped_steps)
            tf.summary.scalar("progress/frames_per_sec", frames_per_sec)
            tf.summary.scalar("time/training_secs", training_secs)
            tf.summary.scalar("actors/policy_lag", policy_lag)

    def learners(
        self,
        frames: int,
        queue_fill: Sequence[float],
        frames_received: Sequence[float],
        actor_reconnections: Sequence[float],
    ) -> None:
        """Per learner (index = rank): how full its queue is, what its actors delivered and how
        often they came back (restarted, or reconnected) since the learner started."""
        with self._writer.as_default(step=frames):
            for rank, (fill, received, back) in enumerate(
                zip(queue_fill, frames_received, actor_reconnections, strict=True)
            ):
                tf.summary.scalar(f"learner_{rank}/queue_fill", fill)
                tf.summary.scalar(f"learner_{rank}/frames_received", received)
                tf.summary.scalar(f"learner_{rank}/actor_reconnections", back)

    def replays(self, frames: int, mixer) -> None:
        """With --replay_parameters: the share of the last batch that was replayed, and each
        replay's fill and how often its stored trajectories were sampled (mean and maximum)."""
        batch_size = mixer.fresh_share + sum(share for _, share, _ in mixer.replays)
        with self._writer.as_default(step=frames):
            tf.summary.scalar("replay/replayed_share", mixer.replayed_last / batch_size)
            for index, (spec, _, store) in enumerate(mixer.replays):
                sampled = store.times_sampled()
                tag = f"replay/{index + 1}_{spec.type}"
                tf.summary.scalar(f"{tag}/fill", store.size / store.capacity)
                tf.summary.scalar(
                    f"{tag}/times_sampled_mean", sampled.mean() if len(sampled) else 0
                )
                tf.summary.scalar(f"{tag}/times_sampled_max", sampled.max() if len(sampled) else 0)
                distances = mixer.distances_last.get(index, ())
                if len(distances):
                    # Elite sampling: how far the replayed trajectories' behaviour policy is
                    # from the learner's (impala/learner/replay.py, `distances`).
                    tf.summary.scalar(f"{tag}/distance_mean", distances.mean())
                    tf.summary.scalar(f"{tag}/distance_max", distances.max())

    def pbt(self, frames: int, values: Mapping[str, float]) -> None:
        """With --with_pbt, at each look: the policy's hyperparameters, objective, generation
        and the policy it copied (-1: none), each under pbt/."""
        with self._writer.as_default(step=frames):
            for name, value in values.items():
                tf.summary.scalar(f"pbt/{name}", value)

    def weights(self, frames: int, variables: Iterable[tf.Variable]) -> None:
        """Histograms of every weight, if this run asked for them."""
        if not self._histograms:
            return
        with self._writer.as_default(step=frames):
            for variable in variables:
                tf.summary.histogram("weights/" + variable.name.replace(":", "_"), variable)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
