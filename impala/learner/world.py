"""How many learners this one trains with, known before TensorFlow loads: whether it joins them
through Horovod (`allreduce.init`), and so whether its process needs Keras (`experiment.py`)."""

import os

# Where the MPI launchers (Open MPI's, MPICH's and Intel MPI's, horovodrun's) put the world's size.
_WORLD_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HOROVOD_SIZE")


def launched_alone() -> bool:
    """Whether no launcher started this process as one of several (mpirun -np 1 is alone)."""
    return all(os.environ.get(name, "1") == "1" for name in _WORLD_SIZE_VARIABLES)


def joins_others(num_learners: int) -> bool:
    """Whether a learner of a run of `num_learners` learners joins the others through Horovod.
    A learner alone (and not one of several ranks, which its start then refuses) does not: it
    never loads Horovod, whose module needs Keras (its synchronised batch normalisation
    subclasses Keras' at import)."""
    return num_learners > 1 or not launched_alone()
