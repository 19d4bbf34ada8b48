"""The seccomp filter for sandboxed commands, built with libseccomp through ctypes, handed to bwrap as --seccomp FD.

Allow by default and refuse what lets a command leave or probe its sandbox: namespaces, tracing, kernel modules and
keyrings, mounts, raw and netlink sockets. Refused calls fail with EPERM (clone3 with ENOSYS, so libc falls back to
clone, whose flags a filter can check); a syscall of another ABI (i386, x32) kills the process, since its numbers
are not the ones checked here.
"""

import ctypes
import errno
import fcntl
import functools
import os

# Values from <seccomp.h> (libseccomp 2.4+); its header is not installed, the ABI is stable.
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_ACT_KILL_PROCESS = 0x80000000
_SCMP_ACT_ERRNO_BASE = 0x00050000
_SCMP_FLTATR_ACT_BADARCH = 2
_SCMP_CMP_MASKED_EQ = 7

# The kernel reads an int argument from the low half of its register; libseccomp's EQ compares all 64 bits, so a
# caller could set high bits to slip past it. Int arguments are compared through this mask instead.
_INT_MASK = 0xFFFFFFFF

_AF_NETLINK = 16
_AF_PACKET = 17
_SOCK_TYPE_MASK = 0xF  # the type argument also carries SOCK_NONBLOCK and SOCK_CLOEXEC
_SOCK_RAW = 3

_CLONE_NAMESPACE_FLAGS = {
    # In clone() this byte is the exit signal (so this rule refuses only invalid signals >= 128): CLONE_NEWTIME takes
    # unshare or clone3, both refused. Listed so the set stays whole.
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

REFUSED_SYSCALLS = (
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "add_key",
    "request_key",
    "keyctl",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    # The new mount API does what mount(2) does.
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # io_uring runs operations (IORING_OP_SOCKET among them) without passing through this filter.
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)


class SeccompUnavailable(RuntimeError):
    """libseccomp is missing or failed; the message says which (Debian package libseccomp2)."""


class _ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp."""

    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


def _errno_action(code: int) -> int:
    return _SCMP_ACT_ERRNO_BASE | (code & 0xFFFF)


@functools.cache
def _libseccomp() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(
            f"cannot load libseccomp.so.2 (install the Debian package libseccomp2): {exc}"
        ) from exc
    try:
        lib.seccomp_init.argtypes = (ctypes.c_uint32,)
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_release.argtypes = (ctypes.c_void_p,)
        lib.seccomp_release.restype = None
        lib.seccomp_attr_set.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
        lib.seccomp_attr_set.restype = ctypes.c_int
        lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
        lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
        lib.seccomp_rule_add_array.argtypes = (
            ctypes.c_void_p,
            ctypes.c_uint32,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.POINTER(_ArgCmp),
        )
        lib.seccomp_rule_add_array.restype = ctypes.c_int
        lib.seccomp_export_bpf.argtypes = (ctypes.c_void_p, ctypes.c_int)
        lib.seccomp_export_bpf.restype = ctypes.c_int
    except AttributeError as exc:
        raise SeccompUnavailable(f"libseccomp.so.2 lacks a needed function (libseccomp2 too old?): {exc}") from exc
    return lib


def _check(rc: int, what: str) -> None:
    # libseccomp returns -errno rather than setting errno.
    if rc < 0:
        raise SeccompUnavailable(f"libseccomp {what} failed: {os.strerror(-rc)}")


def build_filter() -> bytes:
    """The BPF program (raw `struct sock_filter` array, what bwrap --seccomp reads) for the native architecture."""
    lib = _libseccomp()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("libseccomp seccomp_init failed")
    try:
        # A filter made by seccomp_init covers the native arch only; other arches (and x32 numbers) meet this action.
        _check(
            lib.seccomp_attr_set(ctx, _SCMP_FLTATR_ACT_BADARCH, _SCMP_ACT_KILL_PROCESS), "setting the bad-arch action"
        )
        eperm = _errno_action(errno.EPERM)

        def rule(name: str, action: int, *cmps: tuple[int, int, int, int]) -> None:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:  # not a syscall on this arch (libseccomp gives -1 or a negative pseudo number)
                return
            args = (_ArgCmp * max(len(cmps), 1))(*(_ArgCmp(*cmp) for cmp in cmps))
            _check(lib.seccomp_rule_add_array(ctx, action, nr, len(cmps), args), f"adding a rule for {name}")

        for name in REFUSED_SYSCALLS:
            rule(name, eperm)
        for name in ("socket", "socketpair"):
            for family in (_AF_NETLINK, _AF_PACKET):
                rule(name, eperm, (0, _SCMP_CMP_MASKED_EQ, _INT_MASK, family))
        rule("socket", eperm, (1, _SCMP_CMP_MASKED_EQ, _SOCK_TYPE_MASK, _SOCK_RAW))
        for flag in _CLONE_NAMESPACE_FLAGS.values():
            rule("clone", eperm, (0, _SCMP_CMP_MASKED_EQ, flag, flag))
        # clone3 passes its flags in memory, out of a filter's reach.
        rule("clone3", _errno_action(errno.ENOSYS))

        # Exported into a memfd: a pipe could fill up before it is read, and block the export.
        fd = os.memfd_create("egressd-seccomp")
        try:
            _check(lib.seccomp_export_bpf(ctx, fd), "seccomp_export_bpf")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)
    program = b"".join(chunks)
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a malformed program of {len(program)} bytes")
    return program


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def filter_fd(program: bytes) -> int:
    """A readable, inheritable fd holding the program for bwrap --seccomp FD; the caller closes it after starting bwrap.

    A pipe (write end closed, so bwrap reads to EOF) when the program fits its buffer, else a memfd rewound to 0.
    """
    read_end, write_end = os.pipe()
    try:
        fits = len(program) <= fcntl.fcntl(write_end, fcntl.F_GETPIPE_SZ)
        if fits:
            _write_all(write_end, program)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    if not fits:
        # Pipe buffers shrink to one page once a user exceeds fs.pipe-user-pages-soft.
        os.close(read_end)
        read_end = os.memfd_create("egressd-seccomp")
        try:
            _write_all(read_end, program)
            os.lseek(read_end, 0, os.SEEK_SET)
        except BaseException:
            os.close(read_end)
            raise
    os.set_inheritable(read_end, True)
    return read_end
