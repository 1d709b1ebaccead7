"""Every file the system reads, damaged: empty, cut short, random bytes, and written by another
program. Each gives a one-line error naming the file (a checkpoint met on resume: a report naming
it and the one before it used instead), a non-zero exit from a command, no hang (every test has a
timeout), and every other file left as it was.

Checkpoints, flags.json, the run secret, TensorBoard event files, curve files, the workers CSV
and the learning benchmark's files; the commands are run as users run them, in subprocesses.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import networks
import plot
from impala import configs, curves, evaluation, run_folder, run_secret
from impala.learner import checkpoints, optimise
from tests.fake_runs import save_checkpoints
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(300)


def _empty(data: bytes) -> bytes:
    return b""


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _random(data: bytes) -> bytes:
    return np.random.default_rng(len(data)).bytes(max(len(data), 64))


DAMAGES = {"empty": _empty, "truncated": _truncated, "random": _random}


def _damage(path, damage) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(DAMAGES[damage](data))


def _digests(folder, leave_out=()) -> dict[str, str]:
    """Every file under `folder` (but those under `leave_out`) and the SHA-256 of its bytes."""
    found = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(parent, name)
            relative = os.path.relpath(path, folder)
            if not any(relative.startswith(prefix) for prefix in leave_out):
                with open(path, "rb") as f:
                    found[relative] = hashlib.sha256(f.read()).hexdigest()
    return found


def _command(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `python ARGV` at the repository's root as a user would, with a timeout (no hang)."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": ROOT},
    )


def _one_line_error(result: subprocess.CompletedProcess, prefix: str) -> str:
    """The command's error line: it failed, with no traceback, and its last line says why."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(prefix), result.stderr
    return last


# --------------------------------------------------------------------------- #
# Checkpoints: met on resume (the one before is used), and given to --mode=test.
# --------------------------------------------------------------------------- #

VERSIONS = (1, 2, 3)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A run folder with three CartPole checkpoints as a learner writes them, and their weights;
    each test damages its own copy."""
    run_dir = tmp_path_factory.mktemp("saved") / "run"
    weights = save_checkpoints(str(run_dir), versions=VERSIONS)
    return run_dir, weights


@pytest.fixture
def run_copy(saved_run, tmp_path):
    run_dir, weights = saved_run
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    return copy, weights


def _files_of(folder, version) -> dict[str, str]:
    """The checkpoint's index and data files: {"index": path, "data": path}."""
    names = [n for n in os.listdir(folder) if n.startswith(f"ckpt-{version}.")]
    return {name.split(".")[1].split("-")[0]: os.path.join(folder, name) for name in names}


def _write_other_programs_checkpoint(prefix: str) -> None:
    """What another program leaves at `prefix`: a plain tf.train.Checkpoint of another model."""
    model = tf.Variable(np.ones((3, 5), np.float32), name="kernel")
    tf.train.Checkpoint(model=model, step=tf.Variable(7, dtype=tf.int64)).write(prefix)


def _write_checkpoint_with_identity(prefix: str, identity: str) -> None:
    """A checkpoint whose identity is `identity` (JSON text) and nothing else."""
    tf.train.Checkpoint(identity=tf.Variable(identity, trainable=False)).write(prefix)


def _replace_with(folder, version, write) -> None:
    for path in _files_of(folder, version).values():
        os.remove(path)
    write(os.path.join(folder, f"ckpt-{version}"))


def _loader(folder) -> tuple[object, checkpoints.Checkpointer]:
    """A learner's agent and its checkpointer for `folder`, as at a resume (the identity of
    `save_checkpoints`)."""
    agent = networks.make_agent("MLPAgent", 2)
    networks.build_variables(agent, (4,), "float32")
    trainer = optimise.Trainer(agent, configs.LearnerConfig())
    trainer.create_optimizer_slots()
    identity = {
        "level_name": "CartPole-v1",
        "agent_name": "MLPAgent",
        "num_actions": 2,
        "observation_shape": [4],
        "observation_dtype": "float32",
        "num_action_repeats": 1,
    }
    return agent, checkpoints.Checkpointer(str(folder), agent, trainer.optimizer, identity, keep=3)


# Files a restore rewrites: the state file (without the passed-over checkpoint), the versions.
_REWRITTEN = ("checkpoints/checkpoint", "checkpoints/published_version")


def _check_resumed_from_the_one_before(run_dir, weights, damage_latest) -> None:
    folder = run_dir / "checkpoints"
    damage_latest(folder)
    before = _digests(run_dir, leave_out=_REWRITTEN)
    agent, loader = _loader(folder)
    reports = []

    assert loader.restore_latest(reports.append) == str(folder / "ckpt-2")

    assert reports[0].startswith(f"checkpoint {folder / 'ckpt-3'} cannot be read (")
    assert reports[0].endswith("; trying the one before")
    assert all("\n" not in line for line in reports)
    for restored, saved in zip(agent.variables, weights[1], strict=True):
        np.testing.assert_array_equal(restored.numpy(), saved)
    # The damaged checkpoint is set aside as it was, and every other file is as it was.
    after = _digests(run_dir, leave_out=_REWRITTEN)
    assert {name.replace("unusable/", ""): digest for name, digest in after.items()} == before
    assert sorted(os.listdir(folder / "unusable")) == sorted(
        os.path.basename(name) for name in before if "ckpt-3." in name
    )
    assert checkpoints.listed(str(folder)) == (
        [str(folder / "ckpt-1"), str(folder / "ckpt-2")],
        None,
    )


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("part", ["index", "data"])
def test_a_damaged_latest_checkpoint_met_on_resume_falls_back_to_the_one_before(
    run_copy, part, damage
):
    run_dir, weights = run_copy
    _check_resumed_from_the_one_before(
        run_dir, weights, lambda folder: _damage(_files_of(folder, 3)[part], damage)
    )


@pytest.mark.parametrize(
    "write",
    [
        _write_other_programs_checkpoint,
        lambda prefix: _write_checkpoint_with_identity(prefix, "[1, 2]"),
        lambda prefix: _write_checkpoint_with_identity(prefix, "not json"),
    ],
    ids=["another-model", "identity-a-list", "identity-not-json"],
)
def test_another_programs_latest_checkpoint_met_on_resume_falls_back_too(run_copy, write):
    run_dir, weights = run_copy
    _check_resumed_from_the_one_before(
        run_dir, weights, lambda folder: _replace_with(folder, 3, write)
    )


def test_a_state_file_naming_files_outside_the_folder_reaches_none_of_them(run_copy, tmp_path):
    """A state file of another program (or edited) that names checkpoints elsewhere: none of
    them is read, set aside or deleted; the folder's own checkpoints are used."""
    run_dir, _ = run_copy
    folder = run_dir / "checkpoints"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(folder, elsewhere)
    before = _digests(elsewhere)
    (folder / "checkpoint").write_text(
        f'model_checkpoint_path: "{elsewhere}/ckpt-3"\n'
        f'all_model_checkpoint_paths: "{elsewhere}/ckpt-1"\n'
        f'all_model_checkpoint_paths: "../../elsewhere/ckpt-2"\n'
        f'all_model_checkpoint_paths: "{elsewhere}/ckpt-3"\n'
    )
    _, loader = _loader(folder)
    reports = []
    assert loader.restore_latest(reports.append) == str(folder / "ckpt-3")
    assert reports[0].startswith(f"{folder / 'checkpoint'} cannot be read (line ")
    assert reports[0].endswith(f"using the 3 checkpoint(s) in {folder}")
    for version in (4, 5, 6):  # keep=3: each save deletes the oldest kept
        loader.save(frames=100 * version, version=version)
    assert _digests(elsewhere) == before


@pytest.mark.parametrize("damage", ["empty", "random", "huge"])
def test_a_damaged_versions_file_is_reported_and_the_checkpoints_names_used(run_copy, damage):
    run_dir, _ = run_copy
    path = run_dir / "checkpoints" / checkpoints.VERSIONS_FILE
    if damage == "huge":  # another program's number, far beyond any weight version
        path.write_text("9" * 40 + "\n")
    else:
        path.write_text("103\n")
        _damage(path, damage)
    _, loader = _loader(run_dir / "checkpoints")
    reports = []
    loader.restore_latest(reports.append)
    (line,) = reports
    assert line.startswith(f"{path} cannot be read (")
    assert line.endswith("going by the checkpoints' names")
    assert int(loader.version) == 3  # no version above the checkpoints' was recorded


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("part", ["index", "data"])
def test_a_damaged_checkpoint_given_to_mode_test_is_a_one_line_error(run_copy, part, damage):
    run_dir, _ = run_copy
    folder = run_dir / "checkpoints"
    _damage(_files_of(folder, 3)[part], damage)
    before = _digests(run_dir)
    config = evaluation.EvalConfig(checkpoint=str(run_dir), num_episodes=1)
    with pytest.raises(ValueError) as error:
        evaluation.run(config, report=lambda line: None)
    assert str(error.value).startswith(f"{folder / 'ckpt-3'}: ")
    assert "\n" not in str(error.value)
    assert _digests(run_dir) == before


@pytest.mark.parametrize(
    "identity, message",
    [
        ("[1, 2]", "its identity is a JSON list, not an object"),
        ('{"level_name": "CartPole-v1"}', "its identity has no agent_name"),
        (
            json.dumps(
                {
                    "level_name": "CartPole-v1",
                    "agent_name": "MLPAgent",
                    "num_actions": "two",
                    "observation_shape": [4],
                    "observation_dtype": "float32",
                    "num_action_repeats": 1,
                }
            ),
            "its num_actions 'two' is not a number of actions",
        ),
    ],
    ids=["a-list", "keys-missing", "a-bad-value"],
)
def test_a_checkpoint_with_a_foreign_identity_given_to_mode_test_is_refused(
    tmp_path, identity, message
):
    prefix = str(tmp_path / "ckpt-1")
    _write_checkpoint_with_identity(prefix, identity)
    with pytest.raises(ValueError) as error:
        evaluation.run(evaluation.EvalConfig(checkpoint=prefix, num_episodes=1), report=print)
    assert str(error.value) == f"{prefix}: not a checkpoint of this project's learner ({message})"


def test_a_damaged_counter_given_to_mode_test_is_a_one_line_error(tmp_path, run_copy):
    """A checkpoint whose weights and identity read but whose frame count does not."""
    run_dir, _ = run_copy
    prefix = str(tmp_path / "ckpt-9")
    source = str(run_dir / "checkpoints" / "ckpt-3")
    agent = evaluation.restore_agent(source, checkpoints.read_identity(source))
    identity = tf.Variable(json.dumps(checkpoints.read_identity(source)), trainable=False)
    tf.train.Checkpoint(agent=agent, identity=identity).write(prefix)  # no counters
    with pytest.raises(ValueError, match=r"its frames and weight version cannot be read \("):
        evaluation.run(evaluation.EvalConfig(checkpoint=prefix, num_episodes=1), report=print)


@pytest.mark.slow
def test_mode_test_exits_in_one_line_on_another_programs_checkpoint_folder(tmp_path, run_copy):
    """The real command, on a folder a plain tf.train.CheckpointManager of another model wrote
    (state file, timestamps and all), and on this project's run with a random-bytes index."""
    other = tmp_path / "other"
    model = tf.Variable(np.ones((3, 5), np.float32))
    tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(other), 2).save()
    before = _digests(other)
    result = _command("experiment.py", "--mode=test", f"--checkpoint={other}")
    line = _one_line_error(result, f"experiment.py: error: {other / 'ckpt-1'}: ")
    assert "not a checkpoint of this project's learner" in line
    assert result.returncode == 2 and _digests(other) == before

    run_dir, _ = run_copy
    _damage(_files_of(run_dir / "checkpoints", 3)["index"], "random")
    before = _digests(run_dir)
    result = _command("experiment.py", "--mode=test", f"--checkpoint={run_dir}")
    _one_line_error(result, f"experiment.py: error: {run_dir / 'checkpoints' / 'ckpt-3'}: ")
    assert result.returncode == 2 and _digests(run_dir) == before


# --------------------------------------------------------------------------- #
# flags.json and the run secret.
# --------------------------------------------------------------------------- #

_FLAGS = {"batch_size": 32, "level_name": "PongNoFrameskip-v4", "learner_hosts": ["localhost:1"]}


@pytest.mark.parametrize(
    "damage, message",
    [
        ("empty", "not valid JSON"),
        ("truncated", "not valid JSON"),
        ("random", "not valid JSON"),
        ("a-list", "expected a JSON object of flag values"),
        ("another-programs", "batch_size"),
    ],
)
def test_a_damaged_flags_file_stops_run_local_in_one_line(tmp_path, damage, message):
    """What a resume reads first: run_local.py refuses the run folder, and leaves it as it is."""
    run_dir = tmp_path / "run"
    run_folder.write_flags(str(run_dir), _FLAGS)
    path = run_dir / run_folder.FLAGS_FILE
    if damage == "a-list":
        path.write_text('["--batch_size=32"]\n')
    elif damage == "another-programs":  # an object of another program's settings
        path.write_text('{"batch_size": "large", "learning_rate": [0.1]}\n')
    else:
        _damage(path, damage)
    before = _digests(run_dir)
    if damage != "another-programs":  # what every reader of the file is told
        with pytest.raises(ValueError, match=message):
            run_folder.read_flags(str(run_dir))
    result = _command("run_local.py", f"--logdir={tmp_path}", "--experiment=run")
    line = _one_line_error(result, f"run_local.py: error: {path}: ")
    assert message in line and result.returncode == 2
    assert _digests(run_dir) == before and sorted(os.listdir(tmp_path)) == ["run"]


@pytest.mark.parametrize(
    "content",
    [b"", b"0123456789abcdef" * 2, None, b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n"],
    ids=["empty", "truncated", "random", "another-programs"],
)
def test_a_damaged_run_secret_is_refused_in_one_line_and_never_replaced(tmp_path, content):
    path = tmp_path / run_secret.FILE_NAME
    path.write_bytes(DAMAGES["random"](b"") if content is None else content)
    os.chmod(path, 0o600)
    before = path.read_bytes()
    # What a learner does with its run folder's secret: create it unless it exists, then read.
    with pytest.raises(run_secret.SecretError, match="not a run secret") as error:
        run_secret.ensure(str(path))
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)
    result = _command("-m", "impala.run_secret", "check", str(path), timeout=60)
    _one_line_error(result, f"run_secret: error: {path}: not a run secret")
    assert path.read_bytes() == before


# --------------------------------------------------------------------------- #
# TensorBoard event files and curve files, read by plot.py.
# --------------------------------------------------------------------------- #


def _write_events(folder, returns=(-21.0, -20.0, -19.0)) -> str:
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        for index, value in enumerate(returns):
            tf.summary.scalar("episode/return", value, step=1000 * (index + 1))
            tf.summary.scalar("time/training_secs", 10.0 * (index + 1), step=1000 * (index + 1))
    writer.close()
    (path,) = curves.events.event_files(str(folder))
    return path


def _write_foreign_events(folder) -> None:
    """An event file of another TensorBoard program: a Keras-like run's losses and a histogram,
    no episodes."""
    writer = tf.summary.create_file_writer(str(folder))
    with writer.as_default():
        for step in range(3):
            tf.summary.scalar("epoch_loss", 1.0 / (step + 1), step=step)
            tf.summary.histogram("dense/kernel", np.arange(6.0), step=step)
            tf.summary.text("notes", "hello", step=step)
    writer.close()


def _write_records_that_are_not_events(path) -> None:
    """A TFRecord file of another kind (tf.train.Examples) under an event file's name."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for value in range(3):
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
            example = tf.train.Example(features=tf.train.Features(feature={"x": feature}))
            writer.write(example.SerializeToString())


def _plot(*args: str) -> subprocess.CompletedProcess:
    return _command("plot.py", *args)


@pytest.mark.parametrize("damage", ["empty", "random", "another-program", "examples"])
def test_plot_refuses_a_damaged_or_foreign_event_file_in_one_line(tmp_path, capsys, damage):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if damage == "another-program":
        _write_foreign_events(run_dir)
    else:
        path = _write_events(run_dir)
        if damage == "examples":
            _write_records_that_are_not_events(path)
        else:
            _damage(path, damage)
    before = _digests(tmp_path)
    out = tmp_path / "curves.png"
    if damage == "random":  # the command as a user runs it: its exit code and its last line
        result = _plot(str(run_dir), f"--out={out}")
        line = _one_line_error(result, "plot.py: error: ")
        assert result.returncode == 2
    else:  # the others in this process, through the command's main
        try:
            assert plot.main(plot.FLAGS(["plot.py", str(run_dir), f"--out={out}"])) == 2
        finally:
            plot.FLAGS.unparse_flags()
        (line,) = capsys.readouterr().err.splitlines()
    (path,) = curves.events.event_files(str(run_dir))
    assert str(run_dir) in line
    if damage == "random":
        assert line.startswith(
            f"plot.py: error: {path}: not a TensorBoard event file (corrupted record at 0"
        )
    else:  # read without error, and nothing in them to draw
        assert line == f"plot.py: error: no finished episodes in {run_dir} yet"
    assert _digests(tmp_path) == before and not out.exists()


def test_plot_keeps_what_a_cut_event_file_holds_before_the_cut(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = _write_events(run_dir, returns=[float(r) for r in range(-21, -1)])
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) * 2 // 3])
    curve = curves.load_curve(str(run_dir), "run", 5)
    assert 5 < len(curve.returns) < 20
    np.testing.assert_array_equal(curve.returns, np.arange(-21.0, -21.0 + len(curve.returns)))


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "line 1: expected the header frames,return,length_frames,training_hours"),
        (
            b"frames,return,length_frames,training_hours,start_frames\n1000,-21,30",
            "line 2: 3 fields, expected 5",
        ),
        (None, "not a curve file (not ASCII text)"),
        (
            b"job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices\n"
            b"learner,localhost,8001,22,,,\n",
            "line 1: expected the header frames,return,length_frames,training_hours",
        ),
    ],
    ids=["empty", "truncated", "random", "another-programs"],
)
def test_plot_refuses_a_damaged_curve_file_in_one_line(tmp_path, content, message):
    path = tmp_path / "curve.csv"
    path.write_bytes(DAMAGES["random"](b"\x80" * 100) if content is None else content)
    before = _digests(tmp_path)
    out = tmp_path / "curves.png"
    result = _plot(str(path), f"--out={out}")
    line = _one_line_error(result, f"plot.py: error: {path}")
    assert message in line and result.returncode == 2
    assert _digests(tmp_path) == before and not out.exists()


# --------------------------------------------------------------------------- #
# The workers CSV (run_experiment_mm_raw.py) and the learning benchmark's run folder.
# --------------------------------------------------------------------------- #

_WORKERS = (
    "job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices\n"
    "learner,localhost,8001,22,,,\n"
    "actor,localhost,,22,,,\n"
)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty; it needs a header row and one row per process"),
        (_WORKERS.encode()[:50], "header lacks column(s)"),
        (None, "not UTF-8 text"),
        (b"frames,return,length_frames,training_hours\n94080,-21,3032,0.01846\n", "header lacks"),
        (
            b"job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices\n"
            b"learner,localhost,8001,22,,,\n"
            b"learner,127.0.0.1,8001,22,,,\n"
            b"actor,localhost,,22,,,\n",
            "lines 2 and 3: localhost:8001 and 127.0.0.1:8001 are one endpoint",
        ),
    ],
    ids=["empty", "truncated", "random", "another-programs", "one-endpoint-two-names"],
)
def test_the_frontend_refuses_a_damaged_workers_csv_in_one_line(tmp_path, content, message):
    path = tmp_path / "workers.csv"
    path.write_bytes(DAMAGES["random"](b"\xff" * 100) if content is None else content)
    before = _digests(tmp_path)
    result = _command(
        "run_experiment_mm_raw.py", f"--workers_csv_path={path}", "--dry_run", timeout=60
    )
    line = _one_line_error(result, f"run_experiment_mm_raw.py: error: {path}")
    assert message in line and result.returncode == 2 and result.stdout == ""
    assert _digests(tmp_path) == before


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "Expecting value"),
        (b'{"frames": 8000, "stopped_ea', "Unterminated string"),
        (None, None),  # whatever JSON makes of the bytes
        (b'["frames", 8000]', "a JSON list, not an object"),
        (b'{"config": "catch", "final_mean_return": 0.9}', "no stopped_early"),
    ],
    ids=["empty", "truncated", "random", "a-list", "learning-json-in-its-place"],
)
def test_the_learning_benchmark_refuses_a_damaged_summary_in_one_line(tmp_path, content, reason):
    """A run folder of the benchmark whose learner summary is damaged, and whose learning.json
    is too: the command says which file, trains nothing and leaves both as they are."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    summary = out_dir / "learner_0.json"
    summary.write_bytes(DAMAGES["random"](b"\xff" * 80) if content is None else content)
    (out_dir / "learning.json").write_bytes(b'{"config": "catch", "fr')
    before = _digests(tmp_path)
    result = _command("-m", "benchmarks.learning", "--config=catch", f"--out_dir={out_dir}")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if str(summary) in line]
    refusal = f"--out_dir={out_dir} already holds a finished run, whose {summary} cannot be read"
    assert f"{refusal} (" in line and (reason is None or reason in line)
    assert _digests(tmp_path) == before


# --------------------------------------------------------------------------- #
# A run folder another user can change: refused before anything in it is read.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "argv,prefix",
    [
        (["run_local.py"], "run_local.py: error: run folder "),
        (
            ["experiment.py", "--job_name=learner", "--learner_hosts=localhost:1"],
            "experiment.py: error: run folder ",
        ),
    ],
    ids=["run_local", "learner"],
)
def test_a_run_folder_others_can_write_to_is_refused_before_its_flags_are_read(
    tmp_path, argv, prefix
):
    # Another user of the machine can write to the folder above the run (mode 777, not sticky):
    # they plant a flags.json that turns the run's protections off (owner-only files, TLS) and
    # a log that is a link to a file of the victim's. Nothing of it is read or written through.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    run_dir = shared / "run"
    run_dir.mkdir()
    (run_dir / run_folder.FLAGS_FILE).write_text(
        json.dumps({"private_run_files": False, "transport_tls": False, "batch_size": 2})
    )
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.symlink(victim, run_dir / "learners.log")
    before = _digests(run_dir)
    result = _command(*argv, f"--logdir={shared}", "--experiment=run")
    line = _one_line_error(result, prefix)
    assert line.endswith(
        f"{shared} is writable by others and not sticky; another user could change what the "
        "run reads and writes there (give --logdir a folder of yours)"
    ), line
    assert result.returncode == 2
    assert _digests(run_dir) == before and victim.read_text() == "mine\n"
    assert sorted(os.listdir(run_dir)) == ["flags.json", "learners.log"]
