"""A pool of empty network namespaces, made once at supervisor start; each sandbox joins one
(`setns`) instead of creating a fresh namespace per program.

Why: creating and tearing down a network namespace is the single most expensive step of starting a
sandbox here (about 3-4 ms of wall time and ~8 ms of CPU across the machine per program, most of
it in the kernel's asynchronous `cleanup_net`), more than the fork itself.

Why it isolates as well as a fresh one per program:

- A namespace has no interface but a loopback that is down, so there is no route anywhere
  (checked when it is made). Bringing `lo` up, adding an interface, a route or a firewall rule
  needs CAP_NET_ADMIN, which a program (uid 60000+slot, no capabilities, NO_NEW_PRIVS) never has.
  So a program can change nothing in the namespace that outlives it.
- The only things a program can create in it are sockets (abstract unix sockets included: the one
  way two processes in one network namespace can meet without a file). Sockets die with the
  processes that hold them, and a namespace serves one process tree at a time: the supervisor
  takes it out of the pool for a tree and puts it back only after reaping that tree's namespace
  init, which the kernel lets happen only once every process in the pid namespace has exited
  (zap_pid_ns_processes). So no process of an earlier program is alive, and no socket of it is
  open, when the next program joins; programs running at the same time are in different
  namespaces. tests/test_executor_spawn.py checks both (and fails with a shared namespace).

There are three per slot (supervisor.NETNS_PER_SLOT): for the slot's running program, its spare,
and a finished tree still being torn down. The namespaces are held by descriptors in the
supervisor and go away when it exits.
"""

from __future__ import annotations

import os

from vprl.executor.sandbox import syscalls


class SlotNetworks:
    def __init__(self, count: int) -> None:
        self.fds: list[int] = []
        own = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            for _ in range(count):
                syscalls.unshare(syscalls.CLONE_NEWNET)
                self.fds.append(os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC))
            syscalls.setns(own, syscalls.CLONE_NEWNET)  # the supervisor itself stays where it was
            _check_empty(self.fds)
        except BaseException:
            self.close()
            raise
        finally:
            os.close(own)

    def enter(self, index: int) -> None:
        """In a freshly forked sandbox: join namespace `index` (before its descriptors are closed)."""
        syscalls.setns(self.fds[index], syscalls.CLONE_NEWNET)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _check_empty(fds: list[int]) -> None:
    """Prove, in a throwaway child, that nothing is reachable from any of the namespaces."""
    from vprl.executor.sandbox.probe import _check_no_network

    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            for fd in fds:
                syscalls.setns(fd, syscalls.CLONE_NEWNET)
                _check_no_network()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise OSError("a pooled network namespace can reach a network")
