"""The learner role: loss, optimisation step, checkpoints, all-reduce and the learner process."""
