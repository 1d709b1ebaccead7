"""Several policies in one run, with population-based training, through the real processes
(run_local.py: each policy's learner and actor over gRPC): a policy started with a useless
learning rate copies the better one within the budget and then plays as well; stopped after the
copy and resumed by the same command, each policy goes on with its own hyperparameters.

It is also the suite's Catch learning test: Catch from pixels, through the distributed path."""

import json
import re
import signal
import sys

import pytest

from tests.helpers import Processes, processes_with, read_text, wait_until

pytestmark = pytest.mark.slow

FRAMES = 30_000  # each policy's
USELESS_LEARNING_RATE = 1e-6


def _argv(run_dir):
    """The Catch learning benchmark's run of two policies under PBT (`benchmarks.learning`:
    run_local.py, each policy's learner and actor over gRPC)."""
    extra = (
        "--num_policies=2",
        "--num_actors=2",
        "--save_every_secs=5",
        "--with_pbt",
        f'--pbt_initial_hyperparameters={{"1": {{"learning_rate": {USELESS_LEARNING_RATE}}}}}',
        "--pbt_start_mutation=14000",
        "--pbt_period_env_steps=5000",  # looks at 14k, 19k, 24k and 29k
        "--pbt_objective_games=40",
        "--pbt_replace_reward_gap_absolute=0.4",
    )
    return [
        sys.executable,
        "-u",
        "-m",
        "benchmarks.learning",
        "--config=catch",  # catch.QUICK_LEARNING_FLAGS
        f"--frames={FRAMES}",
        f"--out_dir={run_dir}",
        "--window=20",
        "--test_games=2",
        *(f"--extra={flag}" for flag in extra),
    ]


def _looks(policy_dir) -> list[dict]:
    return [json.loads(line) for line in read_text(policy_dir / "pbt.jsonl").splitlines()]


def test_catch_is_learned_and_a_useless_policy_copies_the_better_one_and_a_resume_keeps_each(
    tmp_path,
):
    run_dir = tmp_path / "runs" / "population"
    processes = Processes(str(tmp_path))
    try:
        first = processes.start("first", _argv(run_dir))
        # Stopped (SIGTERM, as a scheduler stops it) once policy 1 has copied policy 0.
        wait_until(
            lambda: (
                any(look["action"] == "replace" for look in _looks(run_dir / "policy_1"))
                or first.poll() is not None
            ),
            400,
            lambda: processes.log(first)[-3000:],
        )
        assert first.poll() is None, processes.log(first)[-3000:]
        first.send_signal(signal.SIGTERM)  # the benchmark stops the run and reports on it
        assert processes.wait(first, 180) == 0, processes.log(first)[-3000:]
        assert processes_with(str(run_dir)) == []
        again = processes.start("again", _argv(run_dir))
        assert processes.wait(again, 400) == 0, processes.log(again)[-3000:]
    finally:
        processes.kill_all()

    copied = next(look for look in _looks(run_dir / "policy_1") if look["action"] == "replace")
    assert copied["donor"] == 0 and copied["generation"] == 1
    assert copied["hyperparameters_before"]["learning_rate"] == USELESS_LEARNING_RATE
    # The donor's learning rate (the flags' 1e-3), perturbed or not: never the useless one.
    assert 1e-3 / 1.5 <= copied["hyperparameters"]["learning_rate"] <= 1e-3 * 1.5
    # Policy 0 kept its own weights until policy 1 had copied them (it may have perturbed its
    # hyperparameters: which of two policies a look finds the worse depends on when it looks).
    early = [look for look in _looks(run_dir / "policy_0") if look["frames"] <= copied["frames"]]
    assert early and all(look["action"] != "replace" for look in early), early

    # Each policy's own folder: checkpoints, flags, summaries and its closing summary.
    for policy in (0, 1):
        folder = run_dir / f"policy_{policy}"
        summary = json.loads((folder / "learner_0.json").read_text())
        assert summary["frames"] == FRAMES
        assert (folder / "flags.json").exists() and any(folder.glob("events.out.tfevents.*"))
        assert json.loads((folder / "flags.json").read_text())["policy"] == policy
    assert (run_dir / "secret").exists() and not (run_dir / "policy_0" / "secret").exists()

    # The resume went on with the hyperparameters of the checkpoint it resumed from: those of
    # the last look before it, after the copy (not the initial ones).
    log = read_text(run_dir / "policy_1" / "learners.log")
    resumed = log[log.rindex("--job_name=learner") :]  # the second start's lines
    done = int(re.search(r"resumed from \S+: (\d+) frames done", resumed)[1])
    last = [look for look in _looks(run_dir / "policy_1") if look["frames"] <= done][-1]
    assert last["generation"] == 1
    lr = last["hyperparameters"]["learning_rate"]
    assert f"pbt: resumed with learning_rate {lr:.3g}, " in resumed and "1 copies so far" in resumed
    assert "pbt: policy 1 starts with" not in resumed

    # Catch learned from pixels: the shallow conv net, each policy's learner and actor over
    # gRPC, on a game whose right action depends on where the ball is in an 84x84x4 uint8
    # picture and whose reward comes 9 steps after the first decision. A random policy scores
    # about -0.75 (15 catches in 20 games would take it a miracle); a broken loss, scrambled
    # observations, misaligned rewards or actors acting with weights other than the learner's
    # keep it there. Of 24 policies learning from scratch on 2026-12-07 (seeds 0 to 3, with and
    # without PBT, two at a time beside a training run), 22 passed 0.8 by 14.2k frames; two, both
    # policy 0 of this test, were slow: one (beside the training run) at -0.3 at 10k, before the
    # test's stop, its entropy term at a fifth of its start's by 17k, best 20 games 0.6 in 30k;
    # the other (CI) best 0.7.
    # Slow, but learned. So the bound is 15 catches in 20 (0.5) at best and at least 10 (0.0) at
    # the end, which a random policy's 2 or 3 never reach (its mean of 20 games is -0.75, give or
    # take 0.15). It was stopped and resumed midway, so a
    # resume that lost the optimiser's state or the weights would show here too. A learned
    # policy's last 20 games swing from run to run: 0.5 to 1.0 in most, 0.1 and 0.2 in runs
    # that collapsed early or had been at 0.7 two progress lines before.
    learned = json.loads((run_dir / "policy_0" / "learner_0.json").read_text())
    assert learned["best_mean_return"] >= 0.5 and learned["mean_return"] >= 0.0, learned
    # After the copy, policy 1 plays as well as a learned policy.
    final = json.loads((run_dir / "policy_1" / "learner_0.json").read_text())
    assert final["mean_return"] >= 0.0, final

    # The benchmark's figures: each policy's in its folder, the population's in the run folder,
    # the test games the best policy's.
    population = json.loads((run_dir / "learning.json").read_text())
    finals = population["final_mean_returns"]
    assert set(finals) == {"0", "1"} and population["best_policy"] in (0, 1)
    best = population["best_policy"]
    assert finals[str(best)] == max(finals.values())
    for policy in (0, 1):
        figures = json.loads((run_dir / f"policy_{policy}" / "learning.json").read_text())
        assert figures["frames"] == FRAMES and figures["final_mean_return"] == finals[str(policy)]
        assert (run_dir / f"policy_{policy}" / "curve.csv").exists()
        assert ("test" in figures) == (policy == best), policy
    assert (run_dir / "learning_curve.png").exists()
