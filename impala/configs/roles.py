"""What each training role's process needs: the job configs of the learner, the actor and the
single-process trainer (--mode=test's is `evaluation.EvalConfig`). Each holds the run's
`GameConfig` (and its network's name), and declares its own job-level settings (queue,
checkpoints, timeouts, hosts, run secret, TLS...), from which `impala/flags.py` makes their
flags."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from impala import run_folder
from impala.configs import replay
from impala.configs.addresses import check_learner_hosts, parse_address
from impala.configs.declare import (
    at_least,
    check_settings,
    config,
    finite,
    non_negative,
    raising,
    rule,
    setting,
)
from impala.configs.game import GameConfig
from impala.configs.learner import BATCH_REUSE_FRESH, BATCH_REUSE_REPLAYING, LearnerConfig
from impala.configs.pbt import TUNED, PbtConfig, check_tuned

# The network a run trains unless told otherwise (`--agent_name`): the Nature DQN's, PPO's Atari
# network; `--preset=paper` takes the paper's shallow one.
DEFAULT_AGENT_NAME = "SimpleConvNetAgent"
# TensorFlow makes the threads it is given: a typo must not ask it for millions.
MAX_ACTOR_THREADS = 256
# The precisions a network may compute in (`networks.COMPUTE_DTYPES`; this module imports no
# TensorFlow).
COMPUTE_DTYPES = ("float32", "bfloat16")
# How experience is collected (`--col_workers_communication`, PyTorchRL's name).
COL_WORKERS_COMMUNICATIONS = ("asynchronous", "synchronous")
# How learners combine their gradients (`--grad_workers_communication`, PyTorchRL's name).
GRAD_WORKERS_COMMUNICATIONS = ("synchronous", "asynchronous")
# How learners send gradients to one another (`allreduce.tape_wrapper`).
GRADIENT_COMPRESSIONS = ("none", "fp16")
# Policies one run may train (`--num_policies`): each is a learner group with its own actors.
MAX_POLICIES = 64


# The flags whose default follows other flags (`implied_defaults`), each after those it follows.
IMPLIED_FLAGS = ("replay_parameters", "batch_reuse")


def implied_defaults(
    values: Mapping[str, Any], fixed: Collection[str], *, single_process: bool = False
) -> dict[str, Any]:
    """The flags whose default follows other flags, for those not in `fixed` (the flags given
    on the command line or by --preset):
      replay_parameters: '' (every trajectory fresh) with synchronous collection, a
        --queue_capacity, a single process (none of which replays) or a batch of one
        trajectory; else `replay.DEFAULT`.
      batch_reuse: 3 passes over a batch that mixes in replayed trajectories, 6 over one of
        fresh trajectories only.

    Args:
      values: every flag's value as the process has it (name -> value).
      single_process: for --job_name=local, whose one process has no replay.
    """
    implied = {}
    replay_text = values["replay_parameters"]
    if "replay_parameters" not in fixed:
        fresh_only = (
            single_process
            or values["col_workers_communication"] == "synchronous"
            or bool(values["queue_capacity"])
            or values["batch_size"] < 2  # no half to replay
        )
        replay_text = implied["replay_parameters"] = "" if fresh_only else replay.DEFAULT
    if "batch_reuse" not in fixed:
        try:
            replaying = replay.replays_any(replay.parse(replay_text)) and not single_process
        except ValueError:
            replaying = True  # the config's check names what is wrong; the default stays
        implied["batch_reuse"] = BATCH_REUSE_REPLAYING if replaying else BATCH_REUSE_FRESH
    return implied


def implied_to_keep(
    saved: Mapping[str, Any],
    given: Mapping[str, Any],
    implied: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> dict[str, Any]:
    """Of a run's `saved` values (flag name -> parsed value) of the flags whose default follows
    others (`IMPLIED_FLAGS`), those that `given` (the flags the run is given) would not bring
    about: each whose saved value is not the one `implied` (the flags' values under those
    given) gives it. In IMPLIED_FLAGS' order, each under `given` and the ones kept before it
    (--batch_reuse after --replay_parameters)."""
    given, kept = dict(given), {}
    for name in IMPLIED_FLAGS:
        if name in saved and name not in given and saved[name] != implied(given)[name]:
            kept[name] = given[name] = saved[name]
    return kept


@config
class _Training:
    """What every training role has: the game, the network, and how often it reports."""

    game: GameConfig = dataclasses.field(default_factory=GameConfig)
    agent_name: str = setting(
        DEFAULT_AGENT_NAME,
        "Network: SimpleConvNetAgent (the Nature DQN's convolutions and fc 512), "
        "ShallowConvNetAgent (the IMPALA paper's shallow one), ShallowConvNetLastActionAgent "
        "(the shallow one, also fed the previous action), ResNetAgent, ResNetLSTMAgent, "
        "ShallowLSTMAgent or MLPAgent (case-insensitive).",
    )
    compute_dtype: str = setting(
        "float32",
        "The precision the network's convolutions and fully connected layer compute in: "
        "float32, or bfloat16 (from float32 weights, which stay float32; faster on CPUs with "
        "AVX512_BF16 or AMX; the conv-stack agents only: SimpleConvNetAgent and the shallow "
        "ones).",
        choices=COMPUTE_DTYPES,
    )
    log_every_secs: float = setting(
        5.0,
        "The learner (and --job_name=local's trainer) writes its progress lines (frames/s, "
        "returns, loss, policy lag, refused calls) and its TensorBoard training summaries this "
        "often, in seconds; 0: after every step.",
        check=finite(),
    )


@config
class _Connected(_Training):
    """What actors and learners both need to reach each other."""

    learner_hosts: tuple[str, ...] = setting(
        ("localhost:8001",),
        "host:port of each learner, in rank order ([address]:port for an IPv6 address).",
        check=raising(check_learner_hosts),
    )
    secret_file: str = setting(
        "",
        "File holding the run secret that every call between actors and learners carries (64 "
        "hexadecimal digits, owner-only; see `python -m impala.run_secret`). Default: `secret` "
        "in the run folder, which the learner creates if it is missing; actors need "
        "--experiment for that default.",
    )
    transport_tls: bool = setting(
        False,
        "Encrypt the traffic between actors and learners with mutual TLS, with the run's TLS "
        "bundle `tls.pem` beside the run secret (see `python -m impala.run_tls`); the launchers "
        "make and copy it, the learner makes it if it is missing. Every process of a run needs "
        "the same setting. Off: the run secret authenticates each call, in the clear.",
    )
    col_workers_communication: str = setting(
        "asynchronous",
        "How experience is collected (PyTorchRL's name). asynchronous: actors act with the "
        "weights they last fetched; V-trace corrects the lag (IMPALA). synchronous: after each "
        "unroll an actor waits for its learner's next weights, and learners drop trajectories "
        "of older weights: policy lag 0 (A2C, PPO). A batch must fill from one version's "
        "unrolls (--num_envs_per_actor x its actors).",
        choices=COL_WORKERS_COMMUNICATIONS,
    )
    num_policies: int = setting(
        1,
        "Policies this run trains side by side (Sample Factory's name), each with its own "
        "weights, optimiser, learners (--num_learners of them, all-reducing among themselves "
        "only), actors, checkpoints and TensorBoard folder <run>/policy_<k>/. Launchers give "
        "actor i to policy i mod N (the CSV frontend: unless its policy column says otherwise). "
        "1: one policy, in the run folder itself.",
        check=rule(lambda value: 1 <= value <= MAX_POLICIES, f"must be from 1 to {MAX_POLICIES}"),
    )
    policy_index: int = setting(
        0,
        "Which of the run's --num_policies policies this process trains or plays for "
        "(launchers set it for each process); --learner_hosts are that policy's learners.",
        check=non_negative(),
        flag="policy",
    )

    @property
    def synchronous_collection(self) -> bool:
        """Whether actors wait for each new version and learners train at lag 0 only."""
        return self.col_workers_communication == "synchronous"

    def check_policy(self) -> None:
        """Raises a one-line error unless --policy names one of --num_policies."""
        if self.policy_index >= self.num_policies:
            raise ValueError(
                f"--policy={self.policy_index}: out of range for --num_policies="
                f"{self.num_policies} (policies 0-{self.num_policies - 1})"
            )

    @property
    def policy_folder(self) -> int | None:
        """The policy whose folder under the run folder this process uses; None for a run of
        one policy, which lives in the run folder itself."""
        return self.policy_index if self.num_policies > 1 else None


@config
class LearnerJobConfig(_Connected):
    """Everything a learner process needs besides the game and the network.

    Attributes (the others are flags, whose help says what they do):
      learner: the hyperparameters.
      flag_values: every flag of the run, saved by rank 0 as the run folder's `flags.json`.
      stall_warning_secs: warn when no full batch arrived for this long.
      linger_secs: after the last step, keep answering actors for this long so that they hear
        that training is over.
    """

    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    pbt: PbtConfig = dataclasses.field(default_factory=PbtConfig)
    policy_hosts: tuple[str, ...] = setting(
        (),
        "host:port of the rank-0 learner of each of the run's policies, in policy order "
        "(launchers set it): --with_pbt looks at the population through them.",
    )
    run_learner_hosts: tuple[str, ...] = setting(
        (),
        "host:port of every learner of every one of the run's policies (launchers set it in a "
        "run of several): a learner's first start refuses replays that those on its host "
        "would not fit in its free memory between them. Without it, those of its own "
        "--learner_hosts.",
    )
    queue_capacity: int = setting(
        0,
        "Trajectories a learner queues before actors block (0: one batch's share, so that the "
        "learner trains on data its policy has moved little from). Another value implies "
        "--replay_parameters='' (every trajectory fresh).",
        check=non_negative(),
    )
    replay_parameters: str = setting(
        replay.DEFAULT,
        "Replays each batch mixes, a JSON list: one queue of fresh trajectories; standard: "
        "uniform replay; custom: elite sampling (impala/configs/replay.py). The default replays "
        "half of each batch uniformly from the last 1,000 trajectories. '': every trajectory "
        "fresh, the default with --col_workers_communication=synchronous or --queue_capacity.",
        check=lambda name, value: replay.parse(value) and None,
    )
    grad_workers_communication: str = setting(
        "synchronous",
        "How learners combine their gradients (PyTorchRL's name). synchronous: each step "
        "applies the average of the gradients all learners just computed. asynchronous: each "
        "step applies the average of the step before's, all-reduced while this step computes "
        "(the link's time overlaps computation); weights stay identical, and a resume drops "
        "the last step's gradients.",
        choices=GRAD_WORKERS_COMMUNICATIONS,
    )
    gradient_compression: str = setting(
        "none",
        "How learners send their gradients to one another's all-reduce: none (float32) or fp16 "
        "(Horovod's: half the bytes, averaged in half precision; for slow links between "
        "machines, see benchmarks/scaling.py). One learner sends nothing either way.",
        choices=GRADIENT_COMPRESSIONS,
    )
    logdir: str = setting(
        "runs",
        "Holds the run folders: a run lives in <logdir>/<experiment> (its flags, TensorBoard "
        "events, checkpoints, logs). '' writes nothing, not even checkpoints.",
    )
    experiment: str = setting(
        "",
        "Name of the run's folder under --logdir (default: <level_name>-<start time>). Starting "
        "again with the folder of an earlier run resumes it from its latest checkpoint.",
        check=raising(run_folder.check_name),
    )
    private_files: bool = setting(
        True,
        "Keep the run's files to their owner (folders 0700, files 0600): every process of the "
        "run and the launchers set their umask to 077, and the learners make the run folder "
        "owner-only. --noprivate_run_files leaves modes to the umask you start with. The run "
        "secret and TLS bundle are owner-only either way.",
        flag="private_run_files",
    )
    summary_histograms: bool = setting(
        False, "Also write histograms of the weights to TensorBoard."
    )
    save_every_secs: float = setting(
        600.0, "Rank 0 writes a checkpoint this often.", check=finite(positive=True)
    )
    keep_checkpoints: int = setting(3, "How many recent checkpoints to keep.", check=at_least(1))
    keep_checkpoint_every_frames: float = setting(
        0.0,
        "Also keep the first checkpoint written at or after each multiple of this many frames "
        "(0: none), as long as the run keeps this setting: points to follow a run's policy "
        "along (benchmarks/pong_points.py) or to branch it from.",
        check=rule(
            lambda value: value == 0 or 1 <= value < math.inf,
            "must be 0 (none) or a finite number of frames >= 1",
        ),
    )
    flag_values: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stall_warning_secs: float = 60.0
    linger_secs: float = 3.0

    def _run_learner_host_parts(self) -> list[str]:
        """The host part of each address `learners_on_host` counts: every policy's learners
        (`run_learner_hosts`), else this policy's."""
        flag = "--run_learner_hosts" if self.run_learner_hosts else "--learner_hosts"
        everyone = self.run_learner_hosts or self.learner_hosts
        return [parse_address(address, flag)[0] for address in everyone]

    def run_learner_host_names(self) -> set[str]:
        """The host names `learners_on_host` compares."""
        return set(self._run_learner_host_parts())

    def learners_on_host(self, rank: int, resolved: Mapping[str, set[str]] | None = None) -> int:
        """The learners of the run on the host of the learner of rank `rank`: every policy's
        (`run_learner_hosts`), else this policy's. Two addresses are on one host when their
        host parts are one name, whatever its case, or resolve to a shared address
        (`resolved`: each name's addresses, as `addresses.resolve` gives them)."""
        resolved = resolved or {}
        own_host = parse_address(self.learner_hosts[rank], "--learner_hosts")[0]
        own_addresses = resolved.get(own_host, set())
        return sum(
            host.lower() == own_host.lower() or bool(resolved.get(host, set()) & own_addresses)
            for host in self._run_learner_host_parts()
        )

    @property
    def replays(self) -> tuple[replay.Replay, ...]:
        """`--replay_parameters` read; () without it."""
        return replay.parse(self.replay_parameters)

    def __post_init__(self):
        check_settings(self)
        self.check_policy()
        self.pbt.check_population(self.num_policies)
        if self.pbt.with_pbt:
            learner = self.learner
            check_tuned({name: getattr(learner, name) for name in TUNED})
        if self.pbt.with_pbt and len(self.policy_hosts) != self.num_policies:
            raise ValueError(
                f"--policy_hosts: names {len(self.policy_hosts)} learners; --with_pbt needs "
                f"the rank-0 learner of each of the --num_policies={self.num_policies} (the "
                "launchers give it)"
            )
        for address in self.policy_hosts:
            parse_address(address, "--policy_hosts")
        for address in self.run_learner_hosts:
            parse_address(address, "--run_learner_hosts")
        if self.num_policies > 1 and self.logdir and not self.experiment:
            raise ValueError(
                f"--experiment: needed with --num_policies={self.num_policies}, so that every "
                "policy's learners use the same run folder (launchers name it)"
            )
        if not (self.secret_file or self.logdir):
            raise ValueError(
                "--secret_file: needed with --logdir='' (a run folder would keep the run secret)"
            )
        if self.synchronous_collection and self.replays:
            raise ValueError(
                "--col_workers_communication=synchronous: cannot take --replay_parameters "
                "(replayed trajectories were acted with older weights: their lag is never 0)"
            )
        if self.grad_workers_communication == "asynchronous" and self.pbt.with_pbt:
            raise ValueError(
                "--grad_workers_communication=asynchronous: cannot take --with_pbt (a copy of "
                "another policy's weights would receive this policy's gradients kept from the "
                "step before)"
            )
        if self.synchronous_collection and self.pbt.with_pbt:
            raise ValueError(
                "--col_workers_communication=synchronous: cannot take --with_pbt (a copy gives "
                "a policy another's weight version, which its waiting actors would not follow)"
            )
        batch_size = self.learner.batch_size
        if not (self.queue_capacity == 0 or self.queue_capacity >= batch_size):
            raise ValueError(
                f"--queue_capacity={self.queue_capacity}: must be 0 or at least "
                f"--batch_size={batch_size}, or no batch ever fills"
            )
        if self.replays:
            replay.check_buildable(self.replays)
            replay.batch_shares(self.replays, batch_size)
            if self.queue_capacity:
                raise ValueError(
                    f"--queue_capacity={self.queue_capacity}: with --replay_parameters the "
                    "queue's capacity is its entry's; leave --queue_capacity at 0"
                )


@config
class ActorJobConfig(_Connected):
    """Everything an actor process needs besides the game and the network.

    Attributes (the others are flags, whose help says what they do):
      unroll_length: agent steps per trajectory, the learner's (`LearnerConfig.unroll_length`).
      secret_file: holds the run secret, a copy of the learner's; the TLS bundle is beside it.
    """

    unroll_length: int
    task: int = setting(
        0, "Index of this actor. Learners take their rank from mpirun.", check=non_negative()
    )
    num_envs: int = setting(
        16,
        "Environments each actor steps together.",
        check=at_least(1),
        flag="num_envs_per_actor",
    )
    threads: int = setting(
        1,
        "Threads an actor gives TensorFlow inside one op (its network on a batch of "
        "observations). One leaves the other cores to the learner and the other actors of a "
        "shared host; more can help an actor alone on a host with cores to spare.",
        check=rule(
            lambda value: 1 <= value <= MAX_ACTOR_THREADS, f"must be from 1 to {MAX_ACTOR_THREADS}"
        ),
        flag="actor_threads",
    )
    connect_timeout_secs: float = setting(
        600.0, "How long an actor waits for its learner to come up.", check=finite(positive=True)
    )

    def __post_init__(self):
        check_settings(self)
        self.check_policy()
        if not self.secret_file:
            raise ValueError(
                "--secret_file: an actor needs the run secret: the learner's run folder has "
                "it (<logdir>/<experiment>/secret), copy it owner-only and name it here"
            )

    @property
    def learner_address(self) -> str:
        return self.learner_hosts[self.task % len(self.learner_hosts)]


@config
class LocalConfig(_Training):
    """What a single-process training run needs: the game, the network, the hyperparameters.
    Its one process has no replay, so its default learner makes the passes of fresh
    trajectories (`implied_defaults`), as --job_name=local gives them; a `learner` given
    makes its own `batch_reuse`."""

    learner: LearnerConfig = dataclasses.field(
        default_factory=lambda: LearnerConfig(batch_reuse=BATCH_REUSE_FRESH)
    )
