"""Start a point's process: forked from ckptbench's fork server (processes/forkserver.py), which has already
imported torch, transformers and the point's code, so that each point process starts in a fraction of a
second instead of importing them again (several seconds of CPU on a busy 2-core machine).

Each point still gets a new process: the server never measures anything and never initialises CUDA, so a
point's caching allocator, its settings and its CUDA context start empty, as in a process started from
scratch. The child takes the launcher's environment and working directory as they are at launch (allocator
settings, ranks, test hooks), runs in its own session (a terminal's Ctrl-C reaches the sweep only, which
then ends it) and writes stdout and stderr to a file.

The server is started once per launching process, on its first point; should it fail to start, or with
``CKPTBENCH_FORKSERVER=0``, a point runs in ``python -m ckptbench.processes.point_process`` as before.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Protocol

from ckptbench.processes.workdirs import alive

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


def start(request_path: Path, *, env: dict[str, str], stderr_path: Path) -> Child:
    """Start the point process of the request at ``request_path`` with environment ``env``, its stdout and
    stderr going to ``stderr_path``."""
    server = _server(env) if env.get(FORKSERVER_ENV, "1") != "0" and hasattr(os, "fork") else None
    if server is not None:
        child = server.fork(request_path, env=env, stderr_path=stderr_path)
        if child is not None:
            return child
    command = [sys.executable, "-m", "ckptbench.processes.point_process", str(request_path)]
    with open(stderr_path, "wb") as err:
        # A new session: a terminal's Ctrl-C reaches the parent only, which then ends the child.
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, start_new_session=True
        )


class _Forked:
    """A point process forked by the server, with Popen's pid/returncode/poll/wait (the server reaps it)."""

    def __init__(self, server: _Server, pid: int) -> None:
        self._server = server
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        code = self._server.exit_codes.get(self.pid)
        if code is None and self._server.gone and not alive(self.pid):
            # The server ended before it could reap the child (it was killed): the child's status is lost,
            # only that it ended is known.
            return LOST_EXIT_CODE
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self) -> int | None:
        with self._server.cond:
            while self.returncode is None:
                self._server.cond.wait(0.1)
        return self.returncode


class _Server:
    """The launcher's end of one fork server process."""

    def __init__(self, env: dict[str, str]) -> None:
        # torch.cuda.is_available(), should an import call it, then asks NVML and leaves CUDA uninitialised:
        # a process that initialised CUDA cannot hand it to its forks.
        server_env = {k: v for k, v in env.items() if k not in _POINT_VARS}
        server_env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ckptbench.processes.forkserver"],
            # Its stderr is nobody's: a point's own output goes to the point's file; should the server fail to
            # import, points start without it and show why in theirs.
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only
        )
        self.cond = threading.Condition()
        self.ready = False
        self.gone = False
        self.pids: dict[int, int] = {}  # request id -> pid
        self.exit_codes: dict[int, int] = {}  # pid -> exit status
        self._ids = itertools.count()
        self._write_lock = threading.Lock()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True, name="ckptbench-forkserver").start()

    def close(self) -> None:
        """End the server (its children go on): its stdin's end tells it to."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)

    def _read(self, out: IO[bytes]) -> None:
        for line in out:
            msg = json.loads(line)
            with self.cond:
                if msg.get("ready"):
                    self.ready = True
                elif "id" in msg:
                    self.pids[msg["id"]] = msg["pid"]
                elif "exit" in msg:
                    self.exit_codes[msg["pid"]] = msg["exit"]
                self.cond.notify_all()
        with self.cond:
            self.gone = True
            self.cond.notify_all()
        with contextlib.suppress(Exception):
            self.proc.wait()

    def fork(self, request_path: Path, *, env: dict[str, str], stderr_path: Path) -> _Forked | None:
        """Ask the server for a point process; None when the server is not (or no longer) there."""
        with self.cond:
            self.cond.wait_for(lambda: self.ready or self.gone, SERVER_START_TIMEOUT_S)
            if not self.ready or self.gone:
                return None
        request_id = next(self._ids)
        msg = {"id": request_id, "request": str(request_path), "env": env, "cwd": os.getcwd(),
               "stderr": str(stderr_path)}
        try:
            with self._write_lock:
                assert self.proc.stdin is not None
                self.proc.stdin.write((json.dumps(msg) + "\n").encode())
                self.proc.stdin.flush()
        except OSError:
            return None
        with self.cond:
            self.cond.wait_for(lambda: request_id in self.pids or self.gone)
            pid = self.pids.pop(request_id, None)
        return None if pid is None else _Forked(self, pid)


_lock = threading.Lock()
_servers: dict[int, _Server] = {}  # by the pid of the process that started it: a fork of this one needs its own


def _server(env: dict[str, str]) -> _Server | None:
    """This process's fork server, started on the first call (and again should it have ended)."""
    with _lock:
        server = _servers.get(os.getpid())
        if server is None or server.gone:
            try:
                server = _servers[os.getpid()] = _Server(env)
            except OSError:
                return None
        return server


@atexit.register
def _close_servers() -> None:
    server = _servers.pop(os.getpid(), None)
    if server is not None:
        server.close()
