"""The actor role: the behaviour policy on a vector of environments, and the actor process."""
