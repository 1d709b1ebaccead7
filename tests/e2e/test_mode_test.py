"""experiment.py --mode=test end to end, without Horovod: one-line errors, and a run trained by
a real learner and actor plays and records its games."""

import os
import re
import subprocess
import sys

import pytest

from impala.launch.ports import free_ports
from tests.helpers import ROOT
from tests.videos import check_video

BREAKOUT = "BreakoutNoFrameskip-v4"


def _experiment(*flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # Without Horovod: evaluating a checkpoint must not need the learners' stack.
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.without_ml_stack",
            "--refuse=horovod",
            "experiment.py",
            "--mode=test",
            *flags,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# Scores may be negative or fractional; counts of a thousand or more carry separators ("1,152").
_GAME_LINE = re.compile(
    r"game (\d+): score (-?[\d.]+), ([\d,]+) frames \(([\d,]+) steps\), begun on frame (\d+), "
    r"video (\S+)"
)


@pytest.mark.slow
def test_command_line_errors_are_one_line(cartpole_run):
    run_dir, _ = cartpole_run
    result = _experiment(f"--checkpoint={run_dir}", "--level_name=Acrobot-v1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"experiment.py: error: --level_name=Acrobot-v1 differs from the checkpoint's "
        f"CartPole-v1 ({run_dir}/checkpoints/ckpt-7); leave --level_name out to play its game"
    )


@pytest.mark.slow
def test_a_damaged_checkpoint_is_a_one_line_error(cartpole_run):
    run_dir, _ = cartpole_run
    folder = os.path.join(run_dir, "checkpoints")
    (data,) = [n for n in os.listdir(folder) if n.startswith("ckpt-7.data")]
    with open(os.path.join(folder, data), "r+b") as f:
        f.truncate(os.path.getsize(f.name) // 2)
    result = _experiment(f"--checkpoint={run_dir}")
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"experiment.py: error: {folder}/ckpt-7: ")
    assert "name an earlier checkpoint" in last or "not a checkpoint" in last
    assert "Traceback" not in result.stderr
    # The one before still plays.
    earlier = _experiment(f"--checkpoint={folder}/ckpt-3", "--test_num_episodes=1")
    assert earlier.returncode == 0, earlier.stderr


@pytest.mark.slow
def test_a_trained_run_plays_and_records_its_games(processes, tmp_path):
    """A real learner and actor train briefly; the run folder's checkpoint then plays."""
    (port,) = free_ports(1)
    common = [
        f"--learner_hosts=localhost:{port}",
        f"--level_name={BREAKOUT}",
        "--agent_name=ShallowConvNetAgent",
        "--unroll_length=5",
        "--batch_size=4",
        "--num_envs_per_actor=2",
        # 24 learner steps: 80 fresh frames, then 40 (the default mix replays half a batch).
        "--total_environment_frames=1000",
    ]
    trainer = processes.experiment(
        "learner", "--job_name=learner", f"--logdir={tmp_path}", "--experiment=run", *common
    )
    actor = processes.experiment("actor", "--job_name=actor", "--task=0", *common)
    assert processes.wait(trainer, 180) == 0, processes.log(trainer)
    assert processes.wait(actor, 60) == 0, processes.log(actor)

    run_dir = str(tmp_path / "run")
    result = _experiment(f"--checkpoint={run_dir}", "--test_num_episodes=2", "--record_video")
    assert result.returncode == 0, result.stderr
    loaded = re.search(
        rf"checkpoint {run_dir}/checkpoints/(ckpt-\d+): {BREAKOUT} with ShallowConvNetAgent, "
        r"1,000 frames",
        result.stdout,
    )
    assert loaded, result.stdout
    assert "score over 2 games (sampled policy): mean " in result.stdout
    games = _GAME_LINE.findall(result.stdout)
    assert sorted(int(game[0]) for game in games) == [1, 2], result.stdout
    video_dir = os.path.join(run_dir, "videos", loaded[1])  # one folder per checkpoint
    assert sorted(os.listdir(video_dir)) == ["game_1.mp4", "game_2.mp4"]  # And nothing else.
    for index, _, frames, steps, start, path in games:
        assert 1 <= int(start) <= 29  # the no-ops (fewer than 30) and FIRE before its first step
        assert path == os.path.join(video_dir, f"game_{index}.mp4")
        steps, frames = int(steps.replace(",", "")), int(frames.replace(",", ""))
        assert 4 * (steps - 1) < frames <= 4 * steps  # Frame skip 4.
        assert 10_000 < os.path.getsize(path) < 5_000_000
        check_video(path, steps, fps=15, size=(160, 210))
