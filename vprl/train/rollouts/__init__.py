"""A rollout: a sampled program, executed in the sandbox and scored (`scorer`), written as one row
of the rollouts log (`log`)."""
