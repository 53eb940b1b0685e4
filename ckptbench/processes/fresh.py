"""Start a point's process: forked from ckptbench's fork server (processes/forkserver.py), which has already
imported torch, transformers and the point's code, so that each point process starts in a fraction of a
second instead of importing them again (several seconds of CPU on a busy 2-core machine).

Each point still gets a new process: the server never measures anything and never initialises CUDA, so a
point's caching allocator, its settings and its CUDA context start empty, as in a process started from
scratch. The child takes the launcher's environment and working directory as they are at launch (allocator
settings, ranks, test hooks), runs in its own session (a terminal's Ctrl-C reaches the sweep only, which
then ends it) and writes stdout and stderr to a file.

A sweep starts its server on its first point (and again should it be gone); the local jobs of its fanned-out
points (``--executor local``, on the same machine) have their points forked by the sweep's server too, through
its address. Should the server fail to start, or with ``CKPTBENCH_FORKSERVER=0``, a point runs in ``python -m
ckptbench.processes.point_process`` as before.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

import ckptbench
from ckptbench.processes.workdirs import alive, workdir

FORKSERVER_ENV = "CKPTBENCH_FORKSERVER"
# How long the server may take to import the point's code before points are started without it.
SERVER_START_TIMEOUT_S = 300.0
# A child's exit status when its server was killed before it could tell (the child's end is all that is known).
LOST_EXIT_CODE = 255
# The launcher's per-point variables: a point's child gets them, the server (started by the first point) not.
_POINT_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class Child(Protocol):
    """A started point process: what the launcher polls, kills and reads the exit status of."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self) -> int | None: ...


def python_path(env: dict[str, str]) -> str:
    """``env``'s PYTHONPATH with this ckptbench's package root first: a new process imports the same code."""
    package_root = str(Path(ckptbench.__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)


def enabled(env: dict[str, str]) -> bool:
    """Whether points are forked from a fork server (POSIX, unless CKPTBENCH_FORKSERVER=0)."""
    return env.get(FORKSERVER_ENV, "1") != "0" and hasattr(os, "fork") and hasattr(socket, "AF_UNIX")


def start(request_path: Path, *, env: dict[str, str], stderr_path: Path, via: str | None = None) -> Child:
    """Start the point process of the request at ``request_path`` with environment ``env``, its stdout and
    stderr going to ``stderr_path``; forked by the server at address ``via`` (a local job's sweep's) or by
    this process's own."""
    if enabled(env):
        # The other process's server first; this process's own (started on the first point) only without it.
        for connect in (lambda: _link(via) if via else None, lambda: _own_link(env)):
            link = connect()
            child = link.fork(request_path, env=env, stderr_path=stderr_path) if link is not None else None
            if child is not None:
                return child
    command = [sys.executable, "-m", "ckptbench.processes.point_process", str(request_path)]
    with open(stderr_path, "wb") as err:
        # A new session: a terminal's Ctrl-C reaches the parent only, which then ends the child.
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, start_new_session=True
        )


def shared_address(env: dict[str, str]) -> str | None:
    """The address of this process's fork server (started now if need be), for the local jobs it starts;
    None when points are not forked."""
    if not enabled(env):
        return None
    link = _own_link(env)
    return link.address if link is not None else None


class _Forked:
    """A point process forked by the server, with Popen's pid/returncode/poll/wait (the server reaps it)."""

    def __init__(self, link: _Link, pid: int) -> None:
        self._link = link
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        code = self._link.exit_codes.get(self.pid)
        if code is None and self._link.gone and not alive(self.pid):
            # The server ended before it could tell (it was killed): only that the child ended is known.
            return LOST_EXIT_CODE
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
        while self.returncode is None:
            with self._link.cond:
                self._link.cond.wait(0.1)
        return self.returncode


class _Link:
    """A launcher's connection to a fork server: asks it for children, hears their pids and exit statuses."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address)
        self.cond = threading.Condition()
        self.gone = False
        self.pids: dict[int, int] = {}  # request id -> pid
        self.exit_codes: dict[int, int] = {}  # pid -> exit status
        self._ids = itertools.count()
        self._write_lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True, name="ckptbench-forkserver").start()

    def _read(self) -> None:
        with contextlib.suppress(OSError), self.sock.makefile("rb") as lines:
            for line in lines:
                msg = json.loads(line)
                with self.cond:
                    if "id" in msg:
                        self.pids[msg["id"]] = msg["pid"]
                    elif "exit" in msg:
                        self.exit_codes[msg["pid"]] = msg["exit"]
                    self.cond.notify_all()
        with self.cond:
            self.gone = True
            self.cond.notify_all()

    def fork(self, request_path: Path, *, env: dict[str, str], stderr_path: Path) -> _Forked | None:
        """Ask the server for a point process; None when the server is no longer there."""
        request_id = next(self._ids)
        msg = {"id": request_id, "request": str(request_path), "env": env, "cwd": os.getcwd(),
               "stderr": str(stderr_path)}
        try:
            with self._write_lock:
                self.sock.sendall((json.dumps(msg) + "\n").encode())
        except OSError:
            return None
        with self.cond:
            self.cond.wait_for(lambda: request_id in self.pids or self.gone)
            pid = self.pids.pop(request_id, None)
        return None if pid is None else _Forked(self, pid)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Server:
    """A fork server this process started: it lives while this process holds its stdin open."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = workdir("forkserver")
        address = str(Path(self.folder.name) / "socket")
        # torch.cuda.is_available(), should an import call it, then asks NVML and leaves CUDA uninitialised:
        # a process that initialised CUDA cannot hand it to its forks.
        server_env = {k: v for k, v in env.items() if k not in _POINT_VARS}
        server_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        server_env["PYTHONPATH"] = python_path(env)  # as a point process finds it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckptbench.processes.forkserver", address],
            # Its stderr is nobody's: a point's own output goes to the point's file; should the server fail to
            # start, points start without it and show why in theirs.
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only
        )
        self.link: _Link | None = None
        ready = threading.Event()
        threading.Thread(target=self._wait_ready, args=(ready,), daemon=True).start()
        if ready.wait(SERVER_START_TIMEOUT_S) and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.link = _Link(address)

    def _wait_ready(self, ready: threading.Event) -> None:
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # {"ready": true}, or its end when the server failed
        ready.set()

    def close(self) -> None:
        """End the server (its children go on): its stdin's end tells it to."""
        if self.link is not None:
            self.link.close()
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.folder.cleanup()


_lock = threading.Lock()
_servers: dict[int, _Server] = {}  # by the pid of the process that started it: a fork of this one needs its own
_links: dict[tuple[int, str], _Link] = {}


def _own_link(env: dict[str, str]) -> _Link | None:
    """The link to this process's fork server, started on the first call and again should it have been killed;
    None when it failed to start (this process's points then start from scratch)."""
    with _lock:
        server = _servers.get(os.getpid())
        if server is not None and server.link is not None and server.link.gone:  # it was killed: start another
            _servers.pop(os.getpid()).close()
            server = None
        if server is None:
            try:
                server = _servers[os.getpid()] = _Server(env)
            except OSError:
                return None
        return server.link


def _link(address: str) -> _Link | None:
    """A link to another process's fork server (a local job's sweep's), or None when it cannot be reached."""
    with _lock:
        key = (os.getpid(), address)
        link = _links.get(key)
        if link is None or link.gone:
            try:
                link = _links[key] = _Link(address)
            except OSError:
                return None
        return link


@atexit.register
def _close_servers() -> None:
    server = _servers.pop(os.getpid(), None)
    if server is not None:
        server.close()
