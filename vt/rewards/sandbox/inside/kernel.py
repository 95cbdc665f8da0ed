"""What the warm server asks of the kernel: libc calls Python's os module lacks (mount, capabilities, System V
IPC), and the checks and clean-ups built on them. Runs inside the sandbox (a part of pool_server.py); Python
stdlib only, never imports vt."""
import ctypes
import mmap
import os
import resource

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NAME, PR_SET_DUMPABLE, IPC_RMID = 15, 4, 0
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID = 0x00020000, 0x08000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def mount(source, target, fstype, flags, data=None):
    enc = lambda x: None if x is None else x.encode()  # noqa: E731
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        raise OSError(ctypes.get_errno(), "mount %s" % target)


# A /proc of the caller's PID namespace over /proc, with its processes' directories only (subset=pid): none of the
# host-wide files (stat, meminfo, loadavg, sys/, ...) through which runs could see each other.
PROC_MOUNT = (b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"subset=pid")


def mount_proc():
    if _libc.mount(*PROC_MOUNT) != 0:
        raise OSError(ctypes.get_errno(), "mount /proc")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


CAP_SYS_ADMIN_MASK = 1 << 21


def drop_bounding_set():
    """Empty the bounding set (needs CAP_SETPCAP): no process forked from here can gain a capability again."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            if ctypes.get_errno() == 22:  # EINVAL: past the kernel's last capability
                break
            raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP %d" % cap)


def set_capabilities(mask):
    """Effective and permitted = ``mask`` (capabilities 0-31), inheritable none (the ambient set empties)."""
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    data[0].effective = data[0].permitted = mask
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def drop_capabilities():
    """No capability left in any set (the bounding set is empty since the server's start)."""
    set_capabilities(0)


def close_all_but(keep):
    """Close every fd but those in ``keep`` (one close_range call for each gap, not one close per fd)."""
    low = 0
    for fd in sorted(set(keep)) + [resource.getrlimit(resource.RLIMIT_NOFILE)[0]]:
        if low < fd:  # never an empty range: closerange(n, n) would close from n up (close_range(n, n - 1))
            os.closerange(low, fd)
        low = fd + 1


def resident_bytes(pid):
    with open("/proc/%d/statm" % pid, "rb") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


RLIMITS = tuple(getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))


def scheduling(pid=0):
    """This process's (or ``pid``'s) nice value, scheduling policy and rlimits. A run has our uid, so the kernel
    lets it change each of them here (setpriority, sched_setscheduler, prlimit: not dumpable does not stop
    them), and every later run would inherit the change (nice 19, SCHED_IDLE, a small stack or file limit:
    slower or failing runs for other samples). An unprivileged process cannot lower its nice value or raise a
    hard limit again, so a change is not undone here: the server reports itself unclean and is replaced."""
    limits = tuple(resource.prlimit(pid, r) for r in RLIMITS)
    return os.getpriority(os.PRIO_PROCESS, pid), os.sched_getscheduler(pid), limits



# SHM_INFO / SEM_INFO / MSG_INFO each fill a struct with, among other counts, how many segments / sets /
# queues exist in the caller's IPC namespace: shm_info.used_ids (int 0), seminfo.semusz (int 7),
# msginfo.msgpool (int 0). The buffer and the queries are made once: a run's clean-up allocates nothing.
_info = (ctypes.c_int * 64)()  # larger than any of the three structs
_SYSV_COUNTS = (
    (0, lambda: _libc.shmctl(0, 14, _info)),  # SHM_INFO
    (7, lambda: _libc.semctl(0, 0, 19, _info)),  # SEM_INFO
    (0, lambda: _libc.msgctl(0, 12, _info)),  # MSG_INFO
)


def sysv_ipc_left():
    """Whether any System V IPC object may exist in this namespace: three syscalls and no file read (a
    scan of /proc/sysvipc costs three file objects per run, and after almost every run there is none)."""
    for index, query in _SYSV_COUNTS:
        if query() < 0 or _info[index] != 0:
            return True  # a failed query counts as "maybe": the caller reads /proc/sysvipc
    return False


def remove_sysv_ipc():
    """Remove every System V shared memory segment, semaphore set and message queue of this IPC
    namespace (the sandbox's own): they outlive the processes that made them."""
    if not sysv_ipc_left():
        return True
    ok = True
    for kind, remove in (
        ("shm", lambda i: _libc.shmctl(i, IPC_RMID, None)),
        ("sem", lambda i: _libc.semctl(i, 0, IPC_RMID)),
        ("msg", lambda i: _libc.msgctl(i, IPC_RMID, None)),
    ):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit() and remove(int(fields[1])) != 0:
                ok = False
    return ok


def wipe(path, mode, atime_ns, mtime_ns):
    """Empty a scratch directory (whatever permissions the run set on what it made) and restore the
    directory's own mode, extended attributes and times (last: listing a directory updates its atime)."""
    try:
        os.chmod(path, 0o700)
        for name in os.listdir(path):
            remove_tree(os.path.join(path, name))
        empty = not os.listdir(path)
        for attr in os.listxattr(path):
            if attr.startswith("user."):  # the only namespace an unprivileged run can write
                os.removexattr(path, attr)
        os.chmod(path, mode)
        os.utime(path, ns=(atime_ns, mtime_ns))
    except (OSError, RecursionError):
        return False
    return empty


def remove_tree(path):
    """rm -r, making directories the run locked (chmod 0) writable first."""
    try:
        os.unlink(path)
        return True
    except IsADirectoryError:
        pass
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        os.chmod(path, 0o700)  # a directory the run made unreadable or unwritable
        for name in os.listdir(path):
            remove_tree(os.path.join(path, name))
        os.rmdir(path)
        return True
    except OSError:
        return False
