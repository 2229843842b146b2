"""Deploy a tool stack as a service: `python -m vprl.executor.serve --tool_stack X [--address auto]` (a named stack or a stack YAML's path).

With `--address` (a cluster started with `ray start --head`, "auto" on its node) the tools are
deployed into it and stay there after this command exits; clients name the same stack and the
cluster's address (`tool_service:` in a recipe, `--tool_service` for `vprl.executor.run`). Without it a
local Ray instance is started and the command serves until interrupted. `--delete` removes them.
"""

from __future__ import annotations

import signal
import sys
import time

from vprl.data.cli import CommandParser, fail
from vprl.executor.serve.deploy import ServiceUnavailable, connect, deploy, served_settings, undeploy
from vprl.executor.tools.stack import read_tool_stack


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m vprl.executor.serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tool_stack", required=True, help="a named stack (viunit, ...) or a stack YAML's path")
    parser.add_argument("--address", default=None, help="Ray cluster address ('auto': this node's); none: start one")
    parser.add_argument("--delete", action="store_true", help="remove the stack's applications instead")
    args = parser.parse_args(argv)
    try:
        stack = read_tool_stack(args.tool_stack)
        if args.delete:
            connect(args.address)
            undeploy(served_settings(stack))
            return 0
        settings = deploy(stack, args.address)
    except (FileNotFoundError, ValueError, ServiceUnavailable) as exc:
        fail(str(exc))
    address = connect(args.address)
    for name, placement in settings.placements.items():
        print(f"{settings.app(name)} ({', '.join(settings.members[name])}): {placement}")
    print(f"tool service ready at {address} (clients: tool_service: {address})", flush=True)
    if args.address is None:  # the local cluster lives as long as this process
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
