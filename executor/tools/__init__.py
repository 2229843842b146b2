"""Tool backends behind one batched protocol (see `executor.tools.base`)."""
