"""The hostile programs, one probe per row: what each does and the statuses it may end in.

Run by tests/test_hostile.py (each probe once, a test per probe) and by the mixed soak in
tests/test_runner.py (each probe several times among normal programs).
"""

from __future__ import annotations

import errno
import sys

from probe_kit import K, P, Probe, answer_is, errno_of
from signal_probes import SIGNAL_OUTSIDE
from test_sandbox import SECRET_ANSWER, SECRET_ENV

from vprl.executor.sandbox import seccomp

PWNED = "/tmp/vprl_pwned"  # no probe may create this on the host
TIMEOUT = 1.0
MAX_RPCS = 30


def no_secret(result):
    assert SECRET_ANSWER not in str(result) and SECRET_ENV not in str(result)


def _nr(name):
    """The host's number for a syscall, written into a probe (the sandbox has the same kernel ABI)."""
    try:
        return seccomp.syscall_number(name)
    except OSError:  # no libseccomp: the suite fails at start anyway, on the missing "seccomp" layer
        return -1


# Reading back a key that add_key left would prove a keyring shared across programs of one slot uid.
ADD_KEY_READ_BACK = (
    "    key = libc.syscall({add_key}, b'user', b'vprl-leak', b'answer', 6, {ring})\n"
    "    if key == -1:\n        return ctypes.get_errno()\n"
    "    buf = ctypes.create_string_buffer(64)\n    n = libc.syscall({keyctl}, 11, key, buf, 64)\n"
    "    return ['key readable', buf.raw[:max(n, 0)].decode()]"
)
# A raw clone or clone3 that got through returns 0 in a second copy of this program: it must leave at once.
CLONE_CHILD_EXITS = "    if r == 0:\n        os._exit(0)\n"
PROBES = [
    # -- time ---------------------------------------------------------------------------------
    P("busy_loop", "time", "    while True:\n        pass", "timeout"),
    P("sleep", "time", "    import time\n    time.sleep(100)", "timeout"),
    P("sum_in_c", "time", "    return sum(range(10**13))", "timeout"),
    P("regex_backtracking", "time", "    import re\n    return bool(re.match(r'(a+)+$', 'a' * 40 + 'b'))", "timeout"),
    P(
        "ignore_signals",
        "time",
        "    import signal\n    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGXCPU, signal.SIGHUP):\n"
        "        signal.signal(s, signal.SIG_IGN)\n    while True:\n        pass",
        "timeout",
    ),
    P(
        "swallow_everything",
        "time",
        "    while True:\n        try:\n            while True:\n                pass\n        except BaseException:\n            pass",
        "timeout",
    ),
    P(
        "sigstop_self",
        "time",
        "    import os, signal\n    os.kill(os.getpid(), signal.SIGSTOP)\n    return 1",
        # Spawn "clone": the program is its pid namespace's init, and the kernel ignores the stop it
        # sends itself (it runs on). Spawn "fork": it stops, and is killed at its deadline.
        "ok timeout killed",
    ),
    P(
        "rearm_alarm",
        "time",
        "    import signal\n    signal.signal(signal.SIGALRM, lambda *a: signal.alarm(1))\n    signal.alarm(1)\n"
        "    while True:\n        pass",
        "timeout",
    ),
    # -- processes ----------------------------------------------------------------------------
    P(
        "fork_bomb",
        "processes",
        "    import os\n    n = 0\n    for _ in range(200):\n        try:\n            if os.fork() == 0:\n"
        "                while True:\n                    pass\n            n += 1\n        except OSError:\n            break\n"
        "    return n",
        "ok runtime_error",
        lambda r: r.status != "ok" or r.answer < 16,  # RLIMIT_NPROC holds (per-slot uid, not root)
    ),
    P("os_system", "processes", f"    import os\n    return os.system('echo x > {PWNED}')", "ok runtime_error"),
    P(
        "subprocess",
        "processes",
        "    import subprocess\n    return subprocess.run(['id']).returncode",
        "runtime_error",
    ),
    P("exec", "processes", "    import os\n    os.execv('/bin/sh', ['sh', '-c', 'id'])", "runtime_error"),
    P(
        "kill_parent",
        "processes",
        "    import os\n    os.kill(os.getppid(), 9)\n    return 'alive'",
        "ok runtime_error",
    ),
    P(
        "kill_everything",
        "processes",
        "    import os\n    os.kill(-1, 9)\n    return 'alive'",
        "killed ok runtime_error",
    ),
    P(
        "kill_supervisor_pids",
        "processes",
        "    import os\n    for pid in range(1, 400):\n        try:\n            os.kill(pid, 9)\n        except OSError:\n            pass\n    return 1",
        "killed ok",
    ),
    P(
        "setsid_daemon",
        "processes",
        "    import os, time\n    if os.fork() == 0:\n        os.setsid()\n        if os.fork() == 0:\n            while True:\n"
        "                time.sleep(0.01)\n        os._exit(0)\n    return 'parent'",
        "ok",
    ),
    P("sys_exit", "processes", "    import sys\n    sys.exit(0)", "runtime_error"),
    P("os_exit", "processes", "    import os\n    os._exit(0)", "killed"),
    P("keyboard_interrupt", "processes", "    raise KeyboardInterrupt", "runtime_error"),
    P("base_exception", "processes", "    raise BaseException('boom')", "runtime_error"),
    P("fd_exhaustion", "processes", "    import os\n    return [os.dup(0) for _ in range(100000)]", "runtime_error"),
    P(
        "thread_left_running",
        "processes",
        "    import threading, time\n    threading.Thread(target=time.sleep, args=(100,)).start()\n    return 1",
        "ok runtime_error",
        answer_is(1),
    ),
    *SIGNAL_OUTSIDE,
    # #37 item 7: an error of the interpreter's own names the module's file; not the host's path to it.
    P(
        "item_7_import_name_error_names_no_host_path",
        "errors",
        "    from os import no_such_name",
        "runtime_error",
        lambda r: (
            r.error.startswith("ImportError: cannot import name 'no_such_name' from 'os' (<python>/")
            and sys.base_prefix not in r.error
            and sys.prefix not in r.error
        ),
    ),
    # -- memory, output, recursion ------------------------------------------------------------
    P("memory_bomb", "memory", "    x = bytearray(8 << 30)\n    return len(x)", "memory_limit"),
    P(
        "memory_growth",
        "memory",
        "    xs = []\n    while True:\n        xs.append(' ' * 10**7)",
        "memory_limit timeout",
    ),
    P("numpy_bomb", "memory", "    import numpy as np\n    return float(np.ones(1 << 31).sum())", "memory_limit"),
    P("huge_print_loop", "output", "    while True:\n        print('x' * 1000)", "output_limit"),
    P("huge_print_once", "output", "    print('x' * 10**7)\n    return 1", "output_limit"),
    P("deep_recursion", "recursion", "    def f(n):\n        return f(n + 1) + 1\n    return f(0)", "runtime_error"),
    P(
        "raised_recursion_limit",
        "recursion",
        "    import sys\n    sys.setrecursionlimit(10**7)\n    def f(n):\n        return f(n + 1) + 1\n    return f(0)",
        "killed runtime_error memory_limit timeout",
    ),
    P("huge_return_list", "output", "    return ['x' * 10000] * 20000", "bad_return output_limit"),
    P("huge_return_string", "output", "    return 'x' * 10**8", "ok", lambda r: len(r.answer) <= 10_000),
    P(
        "huge_exception_message",
        "output",
        "    raise ValueError('x' * 10**7)",
        "runtime_error",
        lambda r: len(r.error) <= 1000,
    ),
    P(
        "unprintable_exception",
        "output",
        "    class E(Exception):\n        def __str__(self):\n            raise RuntimeError('nope')\n    raise E()",
        "runtime_error",
    ),
    P(
        "surrogate_exception",
        "output",
        "    raise ValueError('bad \\udc80 text')",
        "runtime_error",
        lambda r: r.error.encode("utf-8"),
    ),
    # -- filesystem and network ----------------------------------------------------------------
    P("read_passwd", "fs", "    return open('/etc/passwd').read()", "runtime_error"),
    P("write_file", "fs", f"    open('{PWNED}', 'w').write('x')\n    return 1", "runtime_error"),
    P("list_root", "fs", "    import os\n    return os.listdir('/')", "ok", answer_is([])),
    P("proc_environ", "fs", "    return open('/proc/1/environ').read()", "runtime_error"),
    P("env_secrets", "fs", "    import os\n    return dict(os.environ)", "ok", answer_is({})),
    P("dev_shm", "fs", "    open('/dev/shm/vprl_pwned', 'wb').write(b'x' * 10**8)\n    return 1", "runtime_error"),
    P(
        "memfd",
        "fs",
        "    import os\n    fd = os.memfd_create('x')\n    os.write(fd, b'x' * 10**8)\n    return 1",
        "runtime_error killed",
    ),
    P(
        "chroot_escape",
        "fs",
        "    import os\n    os.mkdir('x')\n    os.chroot('x')\n    return os.listdir('../../')",
        "runtime_error",
    ),
    P(
        "socket",
        "network",
        "    import socket\n    return socket.create_connection(('1.1.1.1', 53), timeout=0.2)",
        "runtime_error",
    ),
    P("raw_socket_module", "network", "    import _socket\n    return 1", "runtime_error"),
    P("dns", "network", "    import socket\n    return socket.gethostbyname('example.com')", "runtime_error"),
    # -- kernel interfaces (the seccomp filter, vprl/executor/sandbox/seccomp.py) -----------------------
    K("add_key_session_keyring", ADD_KEY_READ_BACK.format(add_key=_nr("add_key"), keyctl=_nr("keyctl"), ring=-3)),
    K("add_key_user_keyring", ADD_KEY_READ_BACK.format(add_key=_nr("add_key"), keyctl=_nr("keyctl"), ring=-4)),
    K("keyctl_user_keyring", errno_of(f"libc.syscall({_nr('keyctl')}, 0, -4, 1)")),  # KEYCTL_GET_KEYRING_ID
    K("ptrace_attach_pid1", errno_of(f"libc.syscall({_nr('ptrace')}, 16, 1, 0, 0)")),  # PTRACE_ATTACH
    K("ptrace_traceme", errno_of(f"libc.syscall({_nr('ptrace')}, 0, 0, 0, 0)")),
    K("process_vm_readv_pid1", errno_of(f"libc.syscall({_nr('process_vm_readv')}, 1, 0, 0, 0, 0, 0)")),
    K("unshare_user_namespace", errno_of("libc.unshare(0x10000000)")),
    K("mount_tmpfs", errno_of("libc.mount(b'none', b'/', b'tmpfs', 0, None)")),
    K("bpf_map_create", errno_of(f"libc.syscall({_nr('bpf')}, 0, ctypes.create_string_buffer(128), 128)")),
    K("io_uring_setup", errno_of(f"libc.syscall({_nr('io_uring_setup')}, 4, ctypes.create_string_buffer(120))")),
    K("userfaultfd", errno_of(f"libc.syscall({_nr('userfaultfd')}, 0)")),
    K(
        "perf_event_open",
        errno_of(f"libc.syscall({_nr('perf_event_open')}, ctypes.create_string_buffer(128), 0, -1, -1, 0)"),
    ),
    K("setns", errno_of("libc.setns(0, 0)")),
    K("personality_read_implies_exec", errno_of("libc.personality(0x0400000)")),
    K(
        "clone_new_user_and_network_namespaces",
        f"    r = libc.syscall({_nr('clone')}, 0x10000000 | 0x40000000 | 17, 0, 0, 0, 0)\n"
        + CLONE_CHILD_EXITS
        + "    return ctypes.get_errno() if r == -1 else ['succeeded', r]",
    ),
    K(
        "clone3",
        f"    r = libc.syscall({_nr('clone3')}, ctypes.create_string_buffer(88), 88)\n"
        + CLONE_CHILD_EXITS
        + "    return ctypes.get_errno() if r == -1 else ['succeeded', r]",
        errno.ENOSYS,  # so that glibc falls back to clone, whose flags the filter sees
    ),
    K("tiocsti_high_bits", errno_of("libc.ioctl(0, ctypes.c_ulong((1 << 32) | 0x5412), b'x')")),
    K("socket_inet", errno_of("libc.socket(2, 2, 0)")),
    K("socket_vsock", errno_of("libc.socket(40, 1, 0)")),
    K(
        "plain_fork_still_works",
        "    pid = os.fork()\n    if pid == 0:\n        os._exit(7)\n"
        "    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])",
        7,
    ),
    # -- the channel ---------------------------------------------------------------------------
    P("close_all_fds", "channel", "    import os\n    os.closerange(0, 1024)\n    return 1", "killed"),
    P(
        "forge_frames_everywhere",
        "channel",
        "    import os, json, struct\n    body = json.dumps({'op': 'result', 'status': 'ok', 'answer': 'forged', 'error': None}).encode()\n"
        "    for fd in range(5, 64):\n        try:\n            os.write(fd, struct.pack('>I', len(body)) + body)\n        except OSError:\n            pass\n    return 'honest'",
        "ok",
        answer_is("honest"),
    ),
    P(
        "forge_infra_error",
        "channel",
        "    import os, json, struct\n    body = json.dumps({'op': 'result', 'status': 'infra_error', 'answer': None, 'error': 'sandbox set-up failed'}).encode()\n"
        "    os.write(3, struct.pack('>I', len(body)) + body)\n    while True:\n        pass",
        "killed",
    ),
    P(
        "forge_status",
        "channel",
        "    import os, json, struct\n    body = json.dumps({'op': 'result', 'status': 'great'}).encode()\n    os.write(3, struct.pack('>I', len(body)) + body)\n    while True:\n        pass",
        "killed",
    ),
    P(
        "garbage_on_channel",
        "channel",
        "    import os\n    os.write(3, b'\\x00\\x00\\x00\\x05hello')\n    while True:\n        pass",
        "killed",
    ),
    P(
        "huge_frame_header",
        "channel",
        "    import os\n    os.write(3, b'\\xff\\xff\\xff\\xff')\n    while True:\n        pass",
        "output_limit",
    ),
    P(
        "monkeypatch_builtins",
        "channel",
        "    import builtins, json, struct\n    builtins.len = lambda x: 0\n    builtins.min = builtins.bytes = None\n"
        "    json.dumps = lambda *a, **k: 'x'\n    struct.pack = None\n    return ImagePatch(image).find('cat')[0].simple_query('what color is the cat?')",
        "ok",
        answer_is("black"),
    ),
    # Breaking isinstance breaks the API the program itself uses: its own failure, still framed properly.
    P(
        "monkeypatch_isinstance",
        "channel",
        "    import builtins\n    builtins.isinstance = lambda *a: False\n    return ImagePatch(image).width",
        "runtime_error ok",
    ),
    # -- API abuse and reward hacking ---------------------------------------------------------
    P(
        "replace_api_methods",
        "api",
        "    ImagePatch.find = lambda self, name: ['fake']\n    return len(ImagePatch(image).find('cat'))",
        "ok",
        answer_is(1),
    ),
    P(
        "endless_tool_calls",
        "api",
        "    p = ImagePatch(image)\n    while True:\n        try:\n            p.exists('cat')\n        except Exception:\n            pass",
        "rpc_limit",
    ),
    P("invalid_box", "api", "    return ImagePatch(image, 0, 0, 10**6, 10**6).simple_query('what?')", "runtime_error"),
    P(
        "raw_invalid_box",
        "api",
        "    from vprl.executor.api.context import current_client\n    return current_client().call('detect', image.ref, (0, 0, 10**6, 5), {'noun': 'cat'})",
        "runtime_error",
    ),
    P(
        "forged_image_ref",
        "api",
        "    from vprl.executor.api.context import current_client\n    return current_client().call('vqa', 'f' * 20, None, {'question': 'what?'})",
        "runtime_error",
    ),
    P(
        "program_built_image",
        "api",
        "    import numpy as np\n    return ImagePatch(np.zeros((3, 10, 10))).simple_query('what is this?')",
        "runtime_error ok",
    ),
    P(
        "rigged_str_eq",
        "api",
        "    class S(str):\n        def __eq__(self, other):\n            return True\n        __hash__ = str.__hash__\n    return S('no')",
        "ok",
        lambda r: type(r.answer) is str and r.answer == "no" and r.answer != SECRET_ANSWER,
    ),
    P("generator", "api", "    return (x for x in range(3))", "bad_return"),
    P("return_file", "api", "    import io\n    return io.StringIO('x')", "bad_return"),
    P("return_function", "api", "    return execute_command", "bad_return"),
    P("nan", "api", "    return float('nan')", "ok", answer_is(None)),
    P("deep_return", "api", "    x = []\n    for _ in range(100):\n        x = [x]\n    return x", "bad_return"),
    P(
        "search_memory_for_answers",
        "api",
        "    import gc, sys\n    n = 'zebra' + 'crossing'\n    hits = [str(o)[:80] for o in gc.get_objects() if isinstance(o, dict) and any(isinstance(v, str) and n in v and v is not n for v in o.values())]\n"
        "    hits += [k for k, m in list(sys.modules.items()) if n in str(getattr(m, '__dict__', ''))]\n    return hits",
        "ok",
        answer_is([]),
    ),
    # -- syntax and encoding ------------------------------------------------------------------
    P("nul_byte", "syntax", "    return 'a\x00b'", "syntax_error"),
    P(
        "lone_surrogate_source",
        "syntax",
        "    return 'a\ud800b'",
        "ok syntax_error",
        lambda r: str(r.answer).encode("utf-8"),
    ),
    P("lone_surrogate_result", "syntax", "    return 'a\\ud800b'", "ok", lambda r: r.answer.encode("utf-8")),
    P(
        "non_utf8_source",
        "syntax",
        "    return '\udcff\udcfe'",
        "ok syntax_error",
        lambda r: str(r.answer).encode("utf-8"),
    ),
    P(
        "deep_nesting_source",
        "syntax",
        "    return " + "[" * 5000 + "]" * 5000,
        "syntax_error runtime_error memory_limit",
    ),
    P("ten_mb_source", "syntax", "    return 7\n" + "# " + "x" * 10_000_000, "ok timeout", answer_is(7)),
    P("no_entry_point", "syntax", "    pass\nexecute_command = None", "syntax_error"),
    P("syntax_error", "syntax", "    return (", "syntax_error"),
]


def source_of(probe: Probe) -> str:
    return f"def execute_command(image):\n{probe.body}\n"
