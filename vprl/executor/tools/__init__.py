"""Tool backends behind one batched protocol (see `vprl.executor.tools.base`)."""
