"""benchmarks.train_stage: its variants, its kernel profile and its command."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import train_stage
from impala.configs import LearnerConfig
from tests.helpers import ROOT


def test_variants_change_the_named_settings_of_the_set_up():
    base = LearnerConfig(batch_size=8)
    variants = train_stage.parse_variants(
        " batch_reuse=3, num_batches_per_epoch=2 ;; normalize_advantages=false;learning_rate=1e-3",
        base,
    )
    assert [variant.label for variant in variants] == [
        "as given",
        "batch_reuse=3, num_batches_per_epoch=2",
        "normalize_advantages=false",
        "learning_rate=1e-3",
    ]
    assert variants[0].config is base
    assert (variants[1].config.batch_reuse, variants[1].config.num_batches_per_epoch) == (3, 2)
    assert variants[1].config.batch_size == 8
    assert variants[2].config.normalize_advantages is False
    assert variants[3].config.learning_rate == 1e-3
    assert {variant.compute_dtype for variant in variants} == {"float32"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("batch_reuse", "'batch_reuse' is not name=value with a learner setting's name"),
        ("bogus=1", "'bogus=1' is not name=value"),
        ("batch_reuse=two", "batch_reuse=two: not a int"),
        ("batch_reuse=1.5", "batch_reuse=1.5: not a int"),
        ("normalize_advantages=maybe", "normalize_advantages=maybe: not a bool"),
        ("num_batches_per_epoch=3", "--num_batches_per_epoch=3: must divide --batch_size=16"),
        ("batch_reuse=0", "--batch_reuse=0: must be at least 1"),
    ],
)
def test_a_bad_variant_is_a_one_line_error(text, message):
    with pytest.raises(ValueError, match=message) as raised:
        train_stage.parse_variants(text, LearnerConfig())
    assert "\n" not in str(raised.value)


def test_the_profile_names_the_kernels_that_ran_and_their_shares():
    a = tf.constant(np.ones((256, 256), np.float32))

    @tf.function
    def work():
        return tf.reduce_sum(tf.matmul(a, a) * 2.0)

    work()
    kernels = train_stage.kernel_profile(lambda: work().numpy(), top=5)
    names = [name for name, _, _ in kernels]
    assert any("MatMul" in name for name in names), kernels
    assert all(seconds >= 0 and 0 <= share <= 1 for _, seconds, share in kernels)
    shares = sum(share for _, _, share in kernels)
    assert shares == pytest.approx(1.0) if len(kernels) < 5 else 0 < shares <= 1 + 1e-9


def test_a_variant_may_change_the_networks_precision():
    (base, low) = train_stage.parse_variants(
        "compute_dtype=bfloat16, batch_reuse=2", LearnerConfig()
    )
    assert base.compute_dtype == "float32"
    assert (low.compute_dtype, low.config.batch_reuse) == ("bfloat16", 2)
    with pytest.raises(ValueError, match="compute_dtype=float16: must be one of float32"):
        train_stage.parse_variants("compute_dtype=float16", LearnerConfig())


def test_the_command_prints_each_variants_speed_against_the_first():
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.train_stage",
            "--level_name=impala/Catch-v0",
            "--agent_name=ShallowConvNetAgent",
            "--batch_size=4",
            "--unroll_length=5",
            "--seconds=0.2",
            "--rounds=1",
            "--variants=batch_reuse=1;num_batches_per_epoch=2,compute_dtype=bfloat16",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    rows = completed.stdout.strip().splitlines()[-3:]
    assert rows[0].startswith("as given ") and rows[0].endswith(" 1.00x")
    assert rows[1].startswith("batch_reuse=1 ") and rows[2].startswith("num_batches_per_epoch=2,")
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks.train_stage", "--variants=bogus=1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "'bogus=1' is not name=value" in bad.stderr
    assert "Traceback" not in bad.stderr
