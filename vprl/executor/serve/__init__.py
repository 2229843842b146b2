"""The vision tools as a service on Ray Serve: one deployment per tool of a stack (`deploy`), shared
by every training process through the `serve` tool backend (`client`). The stack YAML that
describes the tools in-process describes them served; its `serve:` section holds the placement
(`settings`). Command: `python -m vprl.executor.serve --tool_stack X` (a named stack or a stack YAML's path)."""
