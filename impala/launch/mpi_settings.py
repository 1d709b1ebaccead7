"""The Open MPI settings every learner launch gives (the launchers' `mpirun`, and the scaling
benchmark's ranks, which stand for the learners): kept apart from the launch planning so that
a benchmark with flags of its own can read them without the experiment's flags."""

from __future__ import annotations

import os

YIELD_SETTING = "mpi_yield_when_idle"


def default_mca() -> dict[str, str]:
    """The Open MPI settings the learners' mpirun gives unless told otherwise.

    A rank waiting in MPI (Horovod's coordination, an all-reduce whose other rank is still
    computing) gives its core away instead of polling: the actors share the learners' cores.
    Open MPI yields by itself only when ranks outnumber the slots, which they never do here.
    Measured in docs/throughput-history.md ("Learners that wait give their core away"). A value
    the user set in Open MPI's variable (OMPI_MCA_mpi_yield_when_idle) decides instead: mpirun's
    command line would override it.
    """
    if f"OMPI_MCA_{YIELD_SETTING}" in os.environ:
        return {}
    return {YIELD_SETTING: "1"}
