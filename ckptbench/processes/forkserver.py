"""``python -m ckptbench.processes.forkserver ADDRESS``: imports a point process's code once (torch,
transformers' LLaMA, ckptbench's training and measuring code), then forks one point process per request.

Launchers (processes/fresh.py: the sweep that started it, and the local jobs of its fanned-out points) connect
to the Unix socket at ``ADDRESS`` and talk one JSON object a line. The server writes ``{"ready": true}`` on its
stdout once the imports are done and the socket listens; then, for each request ``{"id", "request", "env",
"cwd", "stderr"}``, it forks a child that becomes what ``python -m ckptbench.processes.point_process REQUEST``
would be and answers ``{"id", "pid"}``; when a child ends it tells the launcher that asked for it ``{"pid",
"exit"}`` (the exit status as ``subprocess`` gives it: negative for a signal). The end of its stdin (the sweep
that started it is done or gone) ends it; its children go on, and each ends itself when its launcher is gone
(point_process.py).

This process never measures anything and never touches a GPU: the imports leave CUDA uninitialised
(``torch.cuda.is_available()`` asks NVML here, and the server refuses to serve should CUDA be initialised), so
each forked point initialises CUDA itself and its caching allocator and context start empty, as in a process
started from scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

from ckptbench.processes.workdirs import owner_of, remove_workdirs_of

_REAP_S = 0.05  # how often children that ended are looked for while no request comes


class _Client:
    """One connected launcher: its socket and what it sent that is not a whole line yet."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""

    def send(self, msg: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # a launcher that is gone is told nothing
            self.sock.sendall((json.dumps(msg) + "\n").encode())


def _child(request: dict[str, Any], inherited: list[int]) -> None:
    """In the forked process: become the point's process, run the point, exit (never returns)."""
    code = 1
    try:
        for fd in inherited:  # the server's sockets: a launcher must see the server's end when the server ends
            os.close(fd)
        os.setsid()  # its own session, as start_new_session gives a Popen child: the launcher kills the group
        out = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        # A server started while a local job was submitted has SIGINT blocked (processes/executors.py): a point
        # takes it as a process of its own would.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        os.chdir(request["cwd"])
        os.environ.clear()  # the launcher's environment at launch, not the one this server started with
        os.environ.update(request["env"])
        from ckptbench.processes.point_process import child_main

        code = child_main(request["request"])
    except BaseException:  # as the interpreter would: the traceback on stderr, exit status 1
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _forks_can_use_cuda(torch: Any) -> bool:
    """On a machine where NVML sees GPUs, whether a fork of this process can initialise CUDA: an import that called
    the CUDA runtime (cudaGetDeviceCount initialises it, and torch.cuda.is_initialized() does not tell) would leave
    every forked point unable to (torch's "poison fork"). One probe fork tries, once per server."""
    count = getattr(torch.cuda, "_device_count_nvml", lambda: -1)()
    if count <= 0:
        return True  # no GPU (or NVML cannot say): nothing a point could fail to initialise
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            torch.cuda.init()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def main(address: str) -> int:
    """Serve until the sweep that started this server is done or gone. When it was killed (SIGKILL runs no cleanup),
    its temporary folders (this server's socket, its points' folders) go with this server, not at the next sweep;
    the sweep is found by the name of the server's folder (processes/workdirs.py), not as os.getppid(), which is no
    longer the sweep when it was killed while this server was importing torch."""
    starter = owner_of(Path(address).parent)
    try:
        return _serve(address)
    finally:
        if starter is not None:
            remove_workdirs_of(starter)  # nothing while the sweep runs: a closed stdin is its ordinary goodbye


def _serve(address: str) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launchers decide when points end
    # Python 3.12+ warns at every fork of a process with native threads (torch's import starts some, that hold
    # no lock a point needs: torch's DataLoader forks such processes all the time).
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
    import torch

    import ckptbench.processes.point_process  # noqa: F401  (the imports every point process needs, once)

    if torch.cuda.is_initialized() or not _forks_can_use_cuda(torch):  # points start from scratch instead
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen()
    os.write(1, b'{"ready": true}\n')
    clients: dict[int, _Client] = {}
    owners: dict[int, _Client] = {}  # child pid -> the launcher that asked for it
    while True:
        readable, _, _ = select.select([0, listener.fileno(), *clients], [], [], _REAP_S)
        _reap(owners)
        for fd in readable:
            if fd == 0:
                if not os.read(0, 1 << 16):
                    return 0  # the sweep that started this server is done or gone
            elif fd == listener.fileno():
                sock, _ = listener.accept()
                clients[sock.fileno()] = _Client(sock)
            else:
                client = clients[fd]
                data = b""
                with contextlib.suppress(OSError):
                    data = client.sock.recv(1 << 16)
                if not data:  # that launcher is gone
                    del clients[fd]
                    client.sock.close()
                    continue
                client.pending += data
                while b"\n" in client.pending:
                    line, client.pending = client.pending.split(b"\n", 1)
                    request = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        _child(request, [listener.fileno(), *clients])
                    owners[pid] = client
                    client.send({"id": request["id"], "pid": pid})


def _reap(owners: dict[int, _Client]) -> None:
    """Tell each launcher about its children that have ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        owner = owners.pop(pid, None)
        if owner is not None:
            owner.send({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
