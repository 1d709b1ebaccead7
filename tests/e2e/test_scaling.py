"""benchmarks.scaling for real, quickly: two Horovod ranks in network namespaces over a veth pair
held to 1 Gbit/s; its namespaces, link and processes are gone afterwards, also after a SIGTERM
midway. And its model and flags, which need no root."""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

from benchmarks import scaling_link, scaling_model
from tests.helpers import ROOT, processes_with, read_text, wait_until

QUICK = [
    "--rates=1gbit",
    "--repeats=3",
    "--warmup=1",
    "--step_seconds=0.3",
    "--train_batches=1",
    "--batch_reuse=1",  # one step a batch, not six: the schemes' figures, not their size
    "--train_compression=none",  # fp16 gradients in training: tests/unit/learner/test_two_learners
]


def _require_root_and_ip() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the benchmark makes network namespaces and shapes a link")
    if shutil.which("ip") is None:
        pytest.skip("needs `ip` (Debian's iproute2) to make network namespaces")


def _start(tmp_path, *flags: str) -> tuple[subprocess.Popen, str]:
    log = tmp_path / "scaling.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [sys.executable, "-u", "-m", "benchmarks.scaling", *flags],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process, str(log)


def _assert_all_gone(pid: int) -> None:
    link = scaling_link.Link.for_pid(pid)
    assert not set(link.namespaces) & scaling_link.namespaces_present()
    interfaces = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert all(interface not in interfaces for interface in link.interfaces)
    # mpirun, the daemon of namespace B and both ranks carry the run's name on their lines.
    assert processes_with(link.tag) == []


@pytest.mark.slow
def test_a_quick_run_measures_a_shaped_link_and_removes_it(tmp_path):
    _require_root_and_ip()
    process, log = _start(tmp_path, *QUICK)
    try:
        process.wait(timeout=360)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = read_text(log)
    assert process.returncode == 0, output[-3000:]
    _assert_all_gone(process.pid)
    floats = int(re.search(r"([\d,]+) trainable floats", output)[1].replace(",", ""))
    rows = {
        (match[1], match[2]): float(match[3])
        for match in re.finditer(r"^(unshaped|1gbit)\s+(none|fp16)\s+([\d.]+) ms", output, re.M)
    }
    assert set(rows) == {(link, c) for link in ("unshaped", "1gbit") for c in ("none", "fp16")}
    # The link is shaped: at 1 Gbit/s each rank's float32 gradients take at least their bytes'
    # time to cross, and fp16 about half of that.
    assert rows["1gbit", "none"] >= 0.9 * floats * 4 * 8 / 1e9 * 1e3, output
    assert rows["1gbit", "fp16"] >= 0.9 * floats * 2 * 8 / 1e9 * 1e3, output
    # They crossed the veth pair: rank 0 needs all of rank 1's gradients, so its end of the
    # link received at least their bytes per all-reduce.
    moved = re.search(r"^1gbit\s+none\s+.*?\s([\d.]+) / ([\d.]+) MB", output, re.M)
    assert float(moved[2]) * 1e6 >= 0.9 * floats * 4, output
    assert "To reach 70% at 8 learners on 1gbit:" in output
    assert "To reach 90%" not in output  # no 10gbit measured
    # Both ranks trained under each gradient scheme, on the shaped link, with the compression
    # asked for.
    trained = re.findall(
        r"^(unshaped|1gbit)\s+(none|fp16)\s+([\d.]+) s\s+([\d.]+) s\s+([\d.]+)x as fast$",
        output,
        re.M,
    )
    assert {(link, c) for link, c, *_ in trained} == {("1gbit", "none")}, output
    for _, _, synchronous, asynchronous, ratio in trained:
        assert float(synchronous) > 0 and float(asynchronous) > 0
        assert float(ratio) == pytest.approx(float(synchronous) / float(asynchronous), abs=0.01)


@pytest.mark.slow
def test_sigterm_midway_removes_the_namespaces_and_every_process(tmp_path):
    _require_root_and_ip()
    process, log = _start(tmp_path, *QUICK, "--repeats=1000")
    link = scaling_link.Link.for_pid(process.pid)
    try:
        # Midway: the ranks are up in both namespaces and measuring the first link.
        wait_until(
            lambda: "measuring the unshaped link" in read_text(log) or process.poll() is not None,
            180,
            lambda: read_text(log)[-3000:],
        )
        assert process.poll() is None, read_text(log)[-3000:]
        assert set(link.namespaces) <= scaling_link.namespaces_present()
        assert processes_with(link.tag)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    output = read_text(log)
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM; the namespaces are removed" in output
    assert "Traceback" not in output
    _assert_all_gone(process.pid)


def test_the_ring_model_reproduces_two_ranks_and_grows_with_more():
    fitted = scaling_model.Fit(
        "1gbit",
        "none",
        median=0.060,
        p90=0.07,
        alpha=0.001,
        payload=6_700_000,
        sent=6.9e6,
        received=6.9e6,
    )
    assert fitted.seconds(2) == pytest.approx(0.060)
    # t(N) = 2(N-1) alpha + 2(N-1)/N x bytes / rate, the rate fitted from t(2).
    assert fitted.rate == pytest.approx(6_700_000 / 0.058)
    assert fitted.seconds(8) == pytest.approx(14 * 0.001 + 14 / 8 * 0.058)
    # At the worked-out limits the target is met exactly.
    step, steps_per_batch, target = 0.02, 6, 0.7
    need = scaling_model.gap(fitted, step, steps_per_batch, target)
    t8 = fitted.seconds(8)
    assert need.now == pytest.approx(step / (step + t8))
    batch = steps_per_batch * step
    assert batch / (batch + need.max_all_reduces * t8) == pytest.approx(target)
    assert step / (step + (1 - need.overlap) * t8) == pytest.approx(target)
    assert need.overlap_possible == (need.overlap * t8 <= step)


def test_flags_are_refused_in_one_line():
    for flag, message in [
        ("--rates=1gbps", "--rates: '1gbps' is not a link rate such as 1gbit"),
        ("--compression=zip", "--compression: zip is not one of none, fp16"),
        (
            "--compression=none --train_compression=fp16",
            "--train_compression: fp16 is not one of --compression's (none)",
        ),
        ("--repeats=0", "flag --repeats=0: 0 is not a positive integer"),
        ("--train_batches=-1", "flag --train_batches=-1: -1 is not a non-negative integer"),
        ("--batch_reuse=0", "flag --batch_reuse=0: 0 is not a positive integer"),
        ("--bogus", "Unknown command line flag 'bogus'"),
    ]:
        completed = subprocess.run(
            [sys.executable, "-m", "benchmarks.scaling", *flag.split()],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert completed.returncode == 2, completed.stderr
        (line,) = completed.stderr.strip().splitlines()
        assert line.startswith(f"scaling.py: error: {message}"), line


def test_tc_rates_and_buckets():
    assert scaling_link.rate_bits("1gbit") == 1e9
    assert scaling_link.rate_bits("100mbit") == 1e8
    for wrong in ("1gbps", "gbit", "0gbit", "-1gbit"):
        with pytest.raises(ValueError, match="is not a link rate"):
            scaling_link.rate_bits(wrong)
    # A millisecond at the rate, and never less than 64 KiB.
    assert scaling_link.tbf_arguments("10gbit")[4] == "1250000"
    assert scaling_link.tbf_arguments("100mbit")[4] == str(64 * 1024)
