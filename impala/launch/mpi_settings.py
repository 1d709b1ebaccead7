"""The Open MPI settings every learner launch gives (the launchers' `mpirun`, and the scaling
benchmark's ranks, which stand for the learners): kept apart from the launch planning so that
a benchmark with flags of its own can read them without the experiment's flags."""

from __future__ import annotations

import os

YIELD_SETTING = "mpi_yield_when_idle"
BTL_SETTING = "btl"
# Shared memory between the ranks of one host, and a rank's messages to itself: no TCP.
ONE_HOST_BTL = "self,vader"


def default_mca(one_host: bool = False) -> dict[str, str]:
    """The Open MPI settings the learners' mpirun gives unless told otherwise.

    A rank waiting in MPI (Horovod's coordination, an all-reduce whose other rank is still
    computing) gives its core away instead of polling: the actors share the learners' cores.
    Open MPI yields by itself only when ranks outnumber the slots, which they never do here.
    Measured in docs/throughput-history.md ("Learners that wait give their core away").

    Ranks all on one host (`one_host`) talk through shared memory only (btl self,vader), as
    they would anyway, and so load no TCP transport: that one listens on every interface of
    each rank, without authentication, for peers a run on one host never has. (mpirun's own
    out-of-band listener stays: Open MPI 4.1 opens it on every interface whatever it is told.)

    A value the user set in Open MPI's variable (OMPI_MCA_mpi_yield_when_idle, OMPI_MCA_btl)
    decides instead: mpirun's command line would override it.
    """
    settings = {}
    if f"OMPI_MCA_{YIELD_SETTING}" not in os.environ:
        settings[YIELD_SETTING] = "1"
    if one_host and f"OMPI_MCA_{BTL_SETTING}" not in os.environ:
        settings[BTL_SETTING] = ONE_HOST_BTL
    return settings
