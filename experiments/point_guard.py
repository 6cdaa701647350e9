#!/usr/bin/env python3
"""Run one sweep point so that it dies with the runner (issue 39).

  point_guard.py -- COMMAND ARGS...

The runner starts this in a new process group (session) and it starts
COMMAND (mpiexec and its ranks) below it.  When the runner goes away,
however it goes (Ctrl-C, SIGTERM, SIGHUP, SIGKILL), the guard kills the
group and every process below it: the kernel sends it SIGTERM when its parent dies (Linux
PR_SET_PDEATHSIG), and it also notices a changed parent pid each second
where that is not available.  The exit status is COMMAND's (128 + N when a
signal N ended it).
"""
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def descendants(root):
    """Pids below root, from /proc (Linux; empty elsewhere)."""
    children = {}
    try:
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open("/proc/%s/stat" % d) as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    children.setdefault(ppid, []).append(int(d))
                except (OSError, ValueError, IndexError):
                    pass
    except OSError:
        return []
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_group(*_):
    # mpiexec puts each rank in a process group of its own: the ranks are
    # found as descendants, the rest by the group.  SIGKILL: a point being
    # abandoned has nothing to save.
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, signal.SIG_IGN)
    try:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(137)


def main(argv):
    if len(argv) < 2 or argv[0] != "--":
        sys.stderr.write("usage: point_guard.py -- COMMAND ARGS...\n")
        return 2
    parent = os.getppid()
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, kill_group)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent-pid poll below still notices
    if os.getppid() != parent:  # the runner died before the death signal was armed
        kill_group()
    try:
        child = subprocess.Popen(argv[1:])
    except OSError as e:
        sys.stderr.write("point_guard: cannot run %s: %s\n" % (argv[1], e.strerror))
        return 127
    while True:
        try:
            rc = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent:
                kill_group()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
