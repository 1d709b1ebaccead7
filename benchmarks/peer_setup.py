"""Sample Factory 2's own virtual environment, for `benchmarks/peer.py`: made on first use outside
the repository, with exact pins and the two fixes it needs on this stack, then reused.

Where: `$IMPALA_PEER_DIR`, else `~/.cache/impala-peer/sf2`. It holds `venv/` (the environment),
`setup.log` (every step of every set-up: the commands and pip's output) and `.lock` (two commands
started together set up once). A stamp in the venv names the pins and the fixes it was made with:
when they match, a later call returns at once; when they do not (this file changed), the same
steps run again on the same venv, each one doing only what is left to do.

Nothing here touches the project's `.venv`, and pip reaches only the package registry (and the
wheels this machine keeps on disk, which it takes first).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
import time

# What pip installs, every version exact: the four the comparison names, then everything they
# pull in, as pip resolved them on 2026-12 with Python 3.11 (`pip install --dry-run --report`).
# Why each is pinned:
# - torch 2.13.0+cpu: the CPU build that lies on this machine's disk. The `+cpu` label matches
#   that file only; PyPI has no such file, so a machine without it fails at once instead of
#   downloading the several-GB CUDA build that a plain `torch==2.13.0` takes from PyPI.
# - sample-factory 2.1.1: the release measured; its `[atari]` extra is not used, as it pulls
#   AutoROM, which downloads the ROMs from elsewhere at install time.
# - gymnasium 0.29.1: Sample Factory 2.1.1 needs gymnasium < 1.0.
# - ale-py 0.9.1: ships the ROMs in its wheel and works with gymnasium 0.29 (newer ale-py needs
#   gymnasium 1.x).
# - the rest: so that a set-up made later installs what was measured, not whatever is newest.
PINS = (
    "torch==2.13.0+cpu",
    "sample-factory==2.1.1",
    "gymnasium==0.29.1",
    "ale-py==0.9.1",
    "Farama-Notifications==0.0.6",
    "Jinja2==3.1.6",
    "Markdown==3.11.3",
    "MarkupSafe==3.0.4",
    "PyYAML==6.0.4",
    "Werkzeug==3.1.9",
    "absl-py==2.5.1",
    "annotated-types==0.8.0",
    "anyio==4.16.0",
    "certifi==2026.10.19.post1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "cloudpickle==3.1.3",
    "colorlog==6.12.0",
    "cwevals==0.0.1b1",
    "distro==1.9.0",
    "faster-fifo==1.5.2",
    "filelock==4.3.2",
    "fsspec==2026.9.0",
    "googleapis-common-protos==1.76.0",
    "grpcio==1.85.3",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "httpcore==1.0.9",
    "httpx==0.29.0",
    "huggingface_hub==0.36.2",
    "idna==3.21",
    "mpmath==1.3.0",
    "networkx==3.6.1",
    "numpy==1.26.4",
    "opencv-python==4.11.0.86",
    "opentelemetry-api==1.45.2",
    "opentelemetry-exporter-http-transport==0.66b2",
    "opentelemetry-exporter-otlp-common==0.66b2",
    "opentelemetry-exporter-otlp-proto-common==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2",
    "opentelemetry-proto==1.45.2",
    "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2",
    "packaging==26.4",
    "pillow==13.0.0",
    "platformdirs==4.14.9",
    "protobuf==7.36.2",
    "psutil==7.2.2",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "pyglet==2.1.19",
    "requests==2.34.2",
    "setuptools==84.2.1",
    "signal-slot-mp==1.0.5",
    "sniffio==1.3.1",
    "sympy==1.14.0",
    "tensorboard-data-server==0.7.2",
    "tensorboard==2.21.0",
    "tensorboardX==2.6.5",
    "threadpoolctl==3.8.0",
    "tqdm==4.70.1",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "urllib3==2.8.0",
    "wandb==0.31.0",
    "xxhash==4.1.0",
)

# Fix 1: ale-py 0.9.1 registers its Gymnasium environments only when imported, and nothing in
# Sample Factory imports it, so `PongNoFrameskip-v4` is unknown. A `.pth` line runs at every
# interpreter start of the venv, Sample Factory's worker processes included.
PTH_NAME = "impala_peer_ale_py.pth"
PTH_TEXT = "import ale_py\n"

# Fix 2: Sample Factory 2.1.1's learner records the advantages' range in its summaries, and the
# V-trace path (`--with_vtrace=True`) has no advantages: it crashes there. Guarding the two
# summary lines leaves the training maths as it is.
LEARNER_FILE = os.path.join("sample_factory", "algo", "learning", "learner.py")
LEARNER_ORIGINAL = (
    "        stats.adv_min = var.mb.advantages.min()\n"
    "        stats.adv_max = var.mb.advantages.max()\n"
)
LEARNER_FIXED = (
    '        if "advantages" in var.mb:  # impala-peer: absent on the V-trace path\n'
    "            stats.adv_min = var.mb.advantages.min()\n"
    "            stats.adv_max = var.mb.advantages.max()\n"
)

STAMP_NAME = "impala-peer-stamp.json"
# Bump when a fix changes: the stamp then no longer matches and the set-up runs again.
FIXES_VERSION = 1


class SetupError(Exception):
    """The set-up failed; the message is one line, naming the file or the log to read."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """Sample Factory 2's environment, made.

    Attributes:
      folder: the cache folder (`$IMPALA_PEER_DIR` or `~/.cache/impala-peer/sf2`).
      python: the venv's interpreter.
      log: the set-up log.
      installed_secs: how long this call's set-up took (0 when the stamp matched).
      venv_bytes: the venv's size on disk after this call's set-up (0 when the stamp matched).
    """

    folder: str
    python: str
    log: str
    installed_secs: float = 0.0
    venv_bytes: int = 0


def default_folder() -> str:
    """`$IMPALA_PEER_DIR`, else `~/.cache/impala-peer/sf2`."""
    return os.path.abspath(
        os.environ.get("IMPALA_PEER_DIR")
        or os.path.join(os.path.expanduser("~"), ".cache", "impala-peer", "sf2")
    )


def stamp_text() -> str:
    """What the stamp of a venv made by this version of the set-up says."""
    return json.dumps({"pins": list(PINS), "fixes": FIXES_VERSION}, indent=1) + "\n"


def patch_text(text: str, path: str) -> str | None:
    """`text` (Sample Factory's learner.py) with the summary guard (fix 2); None if it has it
    already. SetupError naming `path` if neither the original lines nor the fixed ones are in
    it (another release: the fix would need checking again)."""
    if LEARNER_FIXED in text:
        return None
    if text.count(LEARNER_ORIGINAL) != 1:
        raise SetupError(
            f"{path}: the two summary lines to guard (stats.adv_min, stats.adv_max) are not "
            f"there as Sample Factory 2.1.1 has them; the fix cannot be applied"
        )
    return text.replace(LEARNER_ORIGINAL, LEARNER_FIXED)


def ensure(folder: str | None = None, report=print) -> Peer:
    """Makes (or checks) Sample Factory 2's venv in `folder` (`default_folder()`); `report`
    gets one line per step. SetupError if a step fails."""
    folder = folder or default_folder()
    venv = os.path.join(folder, "venv")
    python = os.path.join(venv, "bin", "python")
    log = os.path.join(folder, "setup.log")
    stamp = os.path.join(venv, STAMP_NAME)
    if _read(stamp) == stamp_text() and os.access(python, os.X_OK):
        return Peer(folder, python, log)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise SetupError(f"{folder}: {error.strerror or error} (the peer's cache folder)") from None
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another command setting up: wait for it
        if _read(stamp) == stamp_text() and os.access(python, os.X_OK):
            return Peer(folder, python, log)
        started = time.monotonic()
        report(f"setting up Sample Factory 2 in {venv} (log: {log}); a few minutes, once")
        with open(log, "a") as out:
            out.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} set-up in {venv}\n")
            out.flush()
            if not os.access(python, os.X_OK):
                _step(out, log, "making the venv", [_base_python(), "-m", "venv", venv])
            _step(out, log, "installing the pins", [python, "-m", "pip", "install", *PINS])
            site = _site_packages(python, out, log)
            _apply_fixes(site, out)
            _step(out, log, "checking it imports", [python, "-c", _IMPORT_CHECK])
            with open(stamp, "w") as f:
                f.write(stamp_text())
            seconds = time.monotonic() - started
            size = _size(venv)
            out.write(f"=== done in {seconds:.0f} s; the venv takes {size / 2**20:.0f} MiB\n")
        report(f"set up in {seconds:.0f} s; the venv takes {size / 2**20:.0f} MiB")
        return Peer(folder, python, log, seconds, size)


# Sample Factory's Atari example with ale-py's environments known (fix 1) and the CPU build.
_IMPORT_CHECK = (
    "import gymnasium, torch, sf_examples.atari.train_atari\n"
    "assert torch.version.cuda is None, 'not the CPU build of torch'\n"
    "gymnasium.spec('PongNoFrameskip-v4')\n"
)


def _base_python() -> str:
    """The interpreter the project's venv was made from (a venv is made from a real Python)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(1 << 16)
    except OSError:
        return None


def _step(out, log: str, what: str, argv: list[str]) -> str:
    """Runs one set-up command, its output into the log; SetupError naming the log if it
    fails. Returns its standard output."""
    out.write(f"--- {what}: {' '.join(argv)}\n")
    out.flush()
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=out, text=True, check=False)
    out.write(result.stdout)
    out.flush()
    if result.returncode != 0:
        raise SetupError(f"set-up failed {what} (exit status {result.returncode}): see {log}")
    return result.stdout


def _site_packages(python: str, out, log: str) -> str:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return _step(out, log, "finding site-packages", [python, "-c", code]).strip()


def _apply_fixes(site: str, out) -> None:
    """Writes the `.pth` line (fix 1) and guards the summary lines (fix 2), each only if not
    there yet."""
    pth = os.path.join(site, PTH_NAME)
    if _read(pth) != PTH_TEXT:
        with open(pth, "w") as f:
            f.write(PTH_TEXT)
        out.write(f"--- fix 1: wrote {pth}\n")
    learner = os.path.join(site, LEARNER_FILE)
    text = _read_all(learner)
    fixed = patch_text(text, learner)
    if fixed is not None:
        with open(learner, "w") as f:
            f.write(fixed)
        out.write(f"--- fix 2: guarded the advantage summaries in {learner}\n")
    out.flush()


def _read_all(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as error:
        raise SetupError(f"{path}: {error.strerror or error} (the fix cannot be applied)") from None


def _size(folder: str) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
