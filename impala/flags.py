"""Every flag of experiment.py, the presets, and the flag values a run records and forwards.

TensorFlow-free, so that launchers (run_local.py, the frontend) can read, check and forward a
run's flags without the ML stack. Defining the flags is importing this module.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping

from absl import flags

from impala import configs

FLAGS = flags.FLAGS

flags.DEFINE_enum(
    "mode",
    "train",
    ["train", "test"],
    "train: run the role given by --job_name. test: load a checkpoint (--checkpoint) and play "
    "--test_num_episodes games with it, printing statistics of the real game score.",
)
flags.DEFINE_enum(
    "job_name",
    "local",
    ["learner", "actor", "local"],
    "Role of this process. learner: trains, serving its actors (run under mpirun for "
    "several). actor: plays and streams unrolls to learner task mod L. local: actor and "
    "learner in this one process.",
)
flags.DEFINE_integer("task", 0, "Index of this actor. Learners take their rank from mpirun.")
flags.DEFINE_list(
    "learner_hosts",
    ["localhost:8001"],
    "host:port of each learner, in rank order ([address]:port for an IPv6 address).",
)
flags.DEFINE_list(
    "actor_hosts",
    [],
    "Host of each actor, in task order (used by launchers; an actor checks its --task is in "
    "range when given).",
)
flags.DEFINE_integer("num_envs_per_actor", 16, "Environments each actor steps together.")
flags.DEFINE_integer(
    "actor_threads",
    1,
    "Threads an actor gives TensorFlow inside one op (its network on a batch of observations). "
    "One leaves the other cores to the learner and the other actors of a shared host; more can "
    "help an actor alone on a host with cores to spare.",
)
flags.DEFINE_integer(
    "queue_capacity",
    0,
    "Trajectories a learner queues before actors block (0: one batch, so that the learner "
    "trains on data its policy has moved little from).",
)
flags.DEFINE_string(
    "logdir",
    "runs",
    "Holds the run folders: a run lives in <logdir>/<experiment> (its flags, TensorBoard "
    "events, checkpoints, logs). '' writes nothing, not even checkpoints.",
)
flags.DEFINE_string(
    "experiment",
    "",
    "Name of the run's folder under --logdir (default: <level_name>-<start time>). Starting "
    "again with the folder of an earlier run resumes it from its latest checkpoint.",
)
flags.DEFINE_bool(
    "private_run_files",
    True,
    "Keep the run's files to their owner (folders 0700, files 0600): checkpoints hold the "
    "weights, logs and TensorBoard events what the run did. Every process of the run, and the "
    "launchers (run_local.py, the frontend's windows) for the logs, set their umask to 077 (on "
    "top of the one they were started with), and the learners make the run folder owner-only, "
    "one made before too. --noprivate_run_files leaves modes to the umask you start with, e.g. "
    "to share runs with your group. The run secret and TLS bundle are owner-only either way.",
)
flags.DEFINE_string(
    "secret_file",
    "",
    "File holding the run secret that every call between actors and learners carries (64 "
    "hexadecimal digits, readable by its owner only; see `python -m impala.run_secret`). "
    "Default: `secret` in the run folder (<logdir>/<experiment>/secret), which the learner "
    "creates if it is missing; actors need --experiment for that default.",
)
flags.DEFINE_bool(
    "transport_tls",
    False,
    "Encrypt the traffic between actors and learners with mutual TLS: each side accepts only a "
    "peer that holds the run's TLS bundle, `tls.pem` beside the run secret (owner-only; a "
    "certificate authority of the run's own, whose key is not kept: see `python -m "
    "impala.run_tls`). The launchers make it and copy it with the secret; the learner makes it "
    "if it is missing. Every process of a run needs the same setting. Off: the calls travel in "
    "the clear, the run secret authenticating each.",
)
flags.DEFINE_bool(
    "summary_histograms", False, "Also write histograms of the weights to TensorBoard."
)
flags.DEFINE_float("save_every_secs", 600.0, "Rank 0 writes a checkpoint this often.")
flags.DEFINE_integer("keep_checkpoints", 3, "How many recent checkpoints to keep.")
flags.DEFINE_float(
    "keep_checkpoint_every_frames",
    0,
    "Also keep the first checkpoint written at or after each multiple of this many frames (0: "
    "none), as long as the run keeps this setting: points to follow a run's policy along "
    "(benchmarks/pong_points.py) or to branch it from (make bench-learning "
    "ARGS=--branch_from=...).",
)
flags.DEFINE_float(
    "connect_timeout_secs", 600.0, "How long an actor waits for its learner to come up."
)
flags.DEFINE_string(
    "level_name",
    "PongNoFrameskip-v4",
    "Gymnasium environment id with a discrete action space; Atari ids get "
    "DeepMind's preprocessing.",
)
flags.DEFINE_string(
    "agent_name",
    configs.DEFAULT_AGENT_NAME,
    "Network: SimpleConvNetAgent (the Nature DQN's convolutions and fc 512), ShallowConvNetAgent "
    "(the IMPALA paper's shallow one), ShallowConvNetLastActionAgent (the shallow one, also fed "
    "the previous action), ResNetAgent, ResNetLSTMAgent, ShallowLSTMAgent or MLPAgent "
    "(case-insensitive).",
)
flags.DEFINE_integer("seed", 0, "Seeds environments, action sampling and initial weights.")
flags.DEFINE_integer(
    "num_action_repeats", 1, "Times each action is repeated, on top of the Atari frame skip."
)
flags.DEFINE_integer(
    "frame_skip",
    0,
    "Atari only: emulator frames per agent step, the last two max-pooled; 0 for DeepMind's 4, "
    "else at least 2. An odd skip alternates the frame parity from step to step, where 4 keeps "
    "each game on its no-op start's parity. Part of a run's identity: --mode=test plays with the "
    "checkpoint's, and refuses another one given here.",
)
flags.DEFINE_enum(
    "frame_pooling",
    "max",
    list(configs.FRAME_POOLING_CHOICES),
    "Atari only: the frame an agent step shows. max: the pixel-wise maximum of its last two "
    "emulator frames (DeepMind's, for sprites drawn on alternate frames); in Pong it shows a "
    "moving paddle at two heights in the games begun on one parity of frame and never in the "
    "others. last: its last frame alone. Part of a run's identity: --mode=test plays with the "
    "checkpoint's.",
)
flags.DEFINE_float(
    "repeat_action_probability",
    0.0,
    "Atari's sticky actions in training: on each emulator frame the game keeps its previous "
    "action instead of the agent's with this probability (0.25 in Gymnasium's v5 protocol). "
    "It decides for every Atari id, v5 ones included; other ids refuse a value above 0. "
    "Evaluation (--mode=test) always plays without them, the v4 protocol.",
)
flags.DEFINE_float(
    "total_environment_frames",
    200e6,
    "Training budget in emulator frames (agent steps x frame skip x repeats).",
)
# By default the schedule's horizon is the budget, whatever it is, and the learning rate holds
# for its first 85% and falls to 0 over the last 15% (--learning_rate_cooldown_fraction): the
# schedule the README's Learning results measure.
flags.DEFINE_float(
    "learning_rate_anneal_frames",
    0,
    "Emulator frames over which the learning rate anneals linearly to 0, or the frame budget "
    "(--total_environment_frames) if that is longer, so that the rate never reaches 0 before "
    "the run ends: the schedule's horizon. 0 (the default): the budget, whatever it is (the "
    "paper's schedule; also what a cooldown that ends with the budget needs). Before "
    "2026-12-04 the default was 200M, so a shorter run trained with the first frames of that "
    "schedule at an almost held rate.",
)
flags.DEFINE_float(
    "learning_rate_cooldown_frames",
    0,
    "The learning rate holds at --learning_rate until this many emulator frames before the end "
    "of the schedule's horizon (see --learning_rate_anneal_frames), then falls linearly to 0 "
    "over them (0, or the whole horizon: it falls from the start, PPO's schedule): a rate that "
    "stays up while the policy is being learned and steadies it at the end. A cooldown that "
    "would begin after the budget is refused.",
)
flags.DEFINE_float(
    "learning_rate_cooldown_fraction",
    0.15,
    "--learning_rate_cooldown_frames as a share of the schedule's horizon, so that with "
    "--learning_rate_anneal_frames=0 the schedule scales with the budget: the default 0.15 holds "
    "the rate for the first 85% of it and lets it fall over the last 15% (0 or 1: it falls from "
    "the start, the paper's schedule). --learning_rate_cooldown_frames, when not 0, takes its "
    "place.",
)
flags.DEFINE_integer("batch_size", 16, "Trajectories per learner batch (the paper: 32).")
flags.DEFINE_integer("unroll_length", 20, "Agent steps per trajectory.")
flags.DEFINE_integer(
    "batch_reuse",
    6,
    "Optimisation steps the learner takes on each batch (more learning per frame, at the cost "
    "of learner compute; V-trace corrects for the policy having moved).",
)
flags.DEFINE_float("discounting", 0.99, "Discount factor.")
flags.DEFINE_float(
    "vtrace_lambda",
    0.95,
    "V-trace's trace decay in [0, 1], like GAE's lambda: lower bootstraps sooner, with less "
    "variance and more bias.",
)
flags.DEFINE_bool(
    "normalize_advantages",
    True,
    "Scale each batch's policy-gradient advantages to mean 0 and standard deviation 1 (as PPO "
    "does), so that the policy term's weight against the baseline and entropy terms does not "
    "depend on the scale of the returns.",
)
flags.DEFINE_float(
    "policy_clip",
    0.1,
    "0: IMPALA's V-trace policy gradient. In (0, 1): PPO's clipped surrogate objective with "
    "this epsilon, its ratio taken against the behaviour policy that acted and its advantages "
    "r + gamma * v_(s+1) - V(x_s) from the V-trace targets (as Sample Factory's APPO), which "
    "bounds how far several steps on one batch (--batch_reuse) move the policy.",
)
flags.DEFINE_enum(
    "policy_clip_center",
    "behaviour",
    list(configs.POLICY_CLIP_CENTER_CHOICES),
    "With --policy_clip: the policy whose ratio the surrogate clips. behaviour: the policy that "
    "acted (pi / mu), a few batches behind the learner's. learner: the learner's own when the "
    "batch arrived (pi / pi_prox, weighted by min(1, pi_prox / mu)), so that each batch may move "
    "the policy by the clip's range whatever the policy lag: PPO's objective decoupled from the "
    "behaviour policy (Hilton et al. 2021; IMPACT, Luo et al. 2020).",
)
flags.DEFINE_float(
    "entropy_cost",
    0.01,
    "Weight of the entropy bonus (the paper's and PPO's; with the Nature network it took Pong "
    "higher than 0.02 did, which had got the shallow network past a stall on two seeds of "
    'three, README "Learning results").',
)
flags.DEFINE_float(
    "entropy_cost_anneal_frames",
    0,
    "Emulator frames over which the entropy bonus's weight moves linearly from --entropy_cost "
    "to --entropy_cost_final, and stays there after (0: --entropy_cost throughout): a more "
    "random policy while the game is being discovered, a sharper one later.",
)
flags.DEFINE_float(
    "entropy_cost_final",
    0.0,
    "The entropy bonus's weight at the end of --entropy_cost_anneal_frames and after.",
)
flags.DEFINE_float("baseline_cost", 0.5, "Weight of the baseline loss.")
flags.DEFINE_enum(
    "reward_clipping",
    "abs_one",
    list(configs.REWARD_CLIPPING_CHOICES),
    "How rewards are clipped in the loss.",
)
flags.DEFINE_float(
    "gradients_clipping",
    160.0,
    "Clip gradients to this global norm; negative turns clipping off. The loss is a sum over the "
    "batch's steps: 160 over the default 16 x 20 is PPO's 0.5 on a mean (the paper: 40).",
)
flags.DEFINE_float(
    "learning_rate",
    2.5e-4,
    "Learning rate, annealed linearly to 0 over --learning_rate_anneal_frames or the budget "
    "if longer (the paper: 6e-4).",
)
flags.DEFINE_enum(
    "optimizer",
    "adam",
    list(configs.OPTIMIZER_CHOICES),
    "rmsprop: TensorFlow 1's RMSProp (epsilon inside the square root), as in the IMPALA paper. "
    "adam: Adam (epsilon outside the square root).",
)
flags.DEFINE_float("decay", 0.999, "RMSProp decay; Adam's second-moment decay (beta2).")
flags.DEFINE_float("momentum", 0.0, "RMSProp momentum (Adam's beta1 is 0.9).")
flags.DEFINE_float("epsilon", 1e-5, "The optimiser's epsilon (the paper's RMSProp: 0.01).")
flags.DEFINE_enum(
    "preset",
    "",
    ["", "paper"],
    "A named set of hyperparameters for the flags not given explicitly. paper: the IMPALA "
    "paper's shallow network and Atari values (RMSProp, batch 32, one step per batch, lambda 1, "
    "V-trace's policy gradient).",
)
flags.DEFINE_string(
    "checkpoint",
    "",
    "--mode=test: what to load: a run folder (its latest checkpoint), its checkpoints/ folder "
    "or one checkpoint such as runs/pong/checkpoints/ckpt-5000. Default: the run folder "
    "<logdir>/<experiment>.",
)
flags.DEFINE_integer("test_num_episodes", 10, "--mode=test: games to play.")
flags.DEFINE_enum(
    "test_policy",
    "sample",
    ["sample", "greedy"],
    "--mode=test: sample actions from the policy, or take the most likely one.",
)
flags.DEFINE_bool("record_video", False, "--mode=test: write one MP4 per game.")
flags.DEFINE_string(
    "video_dir",
    "",
    "--mode=test --record_video: where the MP4s go (default: <run>/videos/<checkpoint name>).",
)


# The IMPALA paper's Atari hyperparameters (Espeholt et al. 2018, appendix D.3 and the public
# scalable_agent code), one flag away from the defaults. The defaults differ (README, "Learning
# results"): with 2 actors and 10M frames the paper's settings leave Pong's policy at random,
# so the defaults take PPO's Atari settings on V-trace's targets (Sample Factory's APPO), and
# PPO's network, the Nature DQN's, which learned Pong in fewer frames than the paper's shallow one
# in the one run measured with it (seed 1).
PRESETS: dict[str, dict[str, object]] = {
    "paper": {
        "agent_name": "ShallowConvNetAgent",
        "optimizer": "rmsprop",
        "learning_rate": 0.0006,
        "decay": 0.99,
        "momentum": 0.0,
        "epsilon": 0.01,
        "batch_size": 32,
        "unroll_length": 20,
        "batch_reuse": 1,
        "vtrace_lambda": 1.0,
        "normalize_advantages": False,
        "policy_clip": 0.0,
        "policy_clip_center": "behaviour",
        "learning_rate_anneal_frames": 0.0,
        "learning_rate_cooldown_frames": 0.0,
        "learning_rate_cooldown_fraction": 0.0,
        "discounting": 0.99,
        "entropy_cost": 0.01,
        "entropy_cost_anneal_frames": 0.0,
        "entropy_cost_final": 0.0,
        "baseline_cost": 0.5,
        "gradients_clipping": 40.0,
        "reward_clipping": "abs_one",
    },
}


def apply_preset() -> None:
    """Gives the flags of `--preset` their preset values, unless given on the command line."""
    for name, value in PRESETS.get(FLAGS.preset, {}).items():
        if not FLAGS[name].present:
            FLAGS[name].value = value


@contextlib.contextmanager
def as_forwarded(forwarded: Mapping[str, object]) -> Iterator[None]:
    """Gives this module's flags, until the block ends, the values a run's processes get when a
    launcher passes on `forwarded` (flag name -> value): those, then --preset's, then the
    defaults. For launchers, to check those values as the processes will."""
    own = FLAGS.get_flags_for_module(sys.modules[__name__])
    kept = {flag.name: flag.value for flag in own}
    preset = PRESETS.get(forwarded.get("preset", FLAGS["preset"].default), {})
    try:
        for flag in own:
            flag.value = forwarded.get(flag.name, preset.get(flag.name, flag.default))
        yield
    finally:
        for flag in own:
            flag.value = kept[flag.name]


def as_text(value: object) -> str:
    """`value` as a launcher writes it in `--name=<text>`."""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_saved(name: str, value: object) -> object:
    """The value a process gets for this file's flag `name` when a launcher forwards `value`
    (say, from a run's flags.json, which anyone may have edited) as `--name=<as_text(value)>`.

    Raises:
      ValueError: one line naming the flag, if its parser refuses the value.
    """
    if value is None:
        raise ValueError(f"{name}=null: expected a value")
    try:
        return FLAGS[name].parser.parse(as_text(value))
    except (ValueError, TypeError, OverflowError) as error:
        reason = " ".join(str(error).split())
        raise ValueError(f"{name}={value!r}: {reason}") from None


def unset_value(name: str, preset: str) -> object:
    """The value a process gets for flag `name` when it is not given: `preset`'s, else the
    default."""
    return PRESETS.get(preset, {}).get(name, FLAGS[name].default)


def flag_values(only_given: bool = False) -> dict:
    """The flags this file defines, with their values: all of them (what a run folder's
    flags.json holds), or only those given on the command line (what launchers forward)."""
    return {
        flag.name: flag.value
        for flag in FLAGS.get_flags_for_module(sys.modules[__name__])
        if flag.present or not only_given
    }
