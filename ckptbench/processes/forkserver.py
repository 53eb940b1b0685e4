"""``python -m ckptbench.processes.forkserver``: imports a point process's code once (torch, transformers'
LLaMA, ckptbench's training and measuring code), then forks one point process per request.

The launcher (processes/fresh.py) starts it and talks to it over its stdin and stdout, one JSON object a
line. It writes ``{"ready": true}`` once the imports are done; then, for each request ``{"id", "request",
"env", "cwd", "stderr"}``, it forks a child that becomes what ``python -m ckptbench.processes.point_process
REQUEST`` would be and answers ``{"id", "pid"}``; when a child ends it answers ``{"pid", "exit"}`` (the exit
status as ``subprocess`` gives it: negative for a signal). The end of its stdin (the launcher is done or
gone) ends it; its children go on, and each ends itself when its launcher is gone (point_process.py).

This process never measures anything and never touches a GPU: the imports leave CUDA uninitialised
(``torch.cuda.is_available()`` asks NVML here), so each forked point initialises CUDA itself and its
caching allocator and context start empty, as in a process started from scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import traceback
import warnings
from typing import Any

_REAP_S = 0.05  # how often children that ended are looked for while no request comes


def _send(msg: dict[str, Any]) -> None:
    os.write(1, (json.dumps(msg) + "\n").encode())


def _reap() -> None:
    """Tell the launcher about every child that has ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send({"pid": pid, "exit": os.waitstatus_to_exitcode(status)})


def _child(request: dict[str, Any]) -> None:
    """In the forked process: become the point's process, run the point, exit (never returns)."""
    code = 1
    try:
        os.setsid()  # its own session, as start_new_session gives a Popen child: the launcher kills the group
        out = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when points end
    # Python 3.12+ warns at every fork of a process with native threads (torch's import starts some, that
    # hold no lock a point needs: torch's DataLoader forks such processes all the time).
    warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork")
    import torch

    import ckptbench.processes.point_process  # noqa: F401  (the imports every point process needs, once)

    if torch.cuda.is_initialized():  # forks could not use CUDA: points start from scratch instead
        return 1

    _send({"ready": True, "pid": os.getpid()})
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], _REAP_S)
        _reap()
        if not readable:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            return 0  # the launcher is done or gone
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request)
            _send({"id": request["id"], "pid": pid})


if __name__ == "__main__":
    sys.exit(main())
