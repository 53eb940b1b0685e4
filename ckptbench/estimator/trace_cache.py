"""Traces kept on disk between commands: what a traced step leaves (estimator/step_trace.py), read back without
importing torch or transformers, so that asking again (another card, budget, headroom, a subset of the batches)
replays the allocator on traces already made.

A trace depends on the model, the precision, the optimizer, the techniques and the shapes (the Estimator's trace
keys, derived from the axes config/grid.py declares as shaping the step), on a few settings of the config (seed,
learning rate, zero_grad's set_to_none, the LoRA spec), on the target and the rank, and on the code that traced it:
ckptbench's own source (a hash of every module, so that a checkout's edit is a new version too), torch, transformers
and the libraries of the techniques (peft, bitsandbytes, torchao, Liger, cut-cross-entropy, accelerate), and
Python. Not on the card (the estimator adds the cuBLAS workspaces after), the budget or the headroom. A trace the
estimator refuses (a technique it does not trace) is kept as that refusal. The estimates replayed from the traces
are kept beside them, under what each depends on (the Estimator's ``_estimate_key``: the card and the budget too).

Layout: ``<root>/traces/<version>/<kk>/<key>.pickle``, where ``<version>`` hashes the versions above and ``<key>``
what the trace depends on; ``<root>/traces/asked/<subject>.asked``, empty files that say a command on that subject
answered with this cache (estimator/tracer.py: no tracer for it), neither counted nor bounded, removed by ``clear``.
A file holds its full key and versions and is used only when both match (a hash collision or a file of another
version is ignored). Files are written to a temporary name and renamed (a killed command
leaves no half-written entry that is read), and a full or read-only disk only costs the cache, never the answer.
The folder is bounded (``CKPTBENCH_CACHE_MAX_BYTES``, default 2 GiB): past the bound the least recently used
entries go, and the folders of other versions first. What it holds is counted in ``<root>/traces/size`` as entries are
written, so that the folder is walked (a stat of every entry) only when that count passes the bound, not while a
command writes its hundreds of estimates; the count is approximate (two commands writing at once may each miss the
other's bytes) and every walk sets it right.

The root is ``$CKPTBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/ckptbench``, else ``~/.cache/ckptbench``;
``CKPTBENCH_CACHE_DIR=off`` turns the cache off. ``ckptbench cache info`` and ``ckptbench cache clear`` show and
empty it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

ENV_DIR = "CKPTBENCH_CACHE_DIR"
ENV_MAX = "CKPTBENCH_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 2 * 1024**3
_MARKER = ".asked"  # a subject's marker (``marker``): not an entry, removed by ``clear``
FORMAT = 1  # what an entry holds; a new layout is a new version
_OFF = ("off", "none", "0", "no", "false")
# What traces, or refuses to (a technique whose library is missing or cannot be traced: its refusal is kept too).
_PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "torchao", "liger-kernel", "cut-cross-entropy",
             "accelerate")

T = TypeVar("T")


@functools.cache
def code_hash() -> str:
    """A hash of ckptbench's own source (every .py and .c file of the package, by path and content): a trace made by
    other code is another version, a checkout's uncommitted edit included."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(p for p in package.rglob("*") if p.suffix in (".py", ".c") and "__pycache__" not in p.parts):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _version_of(package: str) -> str | None:
    from importlib import metadata  # (here: the command line reads the cache's root before anything else)

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def versions() -> tuple[tuple[str, str | None], ...]:
    """What a trace's code is: ckptbench's source, the packages that trace, Python, and the entry format."""
    return (("ckptbench", code_hash()), *((p, _version_of(p)) for p in _PACKAGES),
            ("python", f"{sys.version_info[0]}.{sys.version_info[1]}"), ("format", str(FORMAT)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def default_root() -> Path | None:
    """Where the cache lives (module docstring), or None when ``CKPTBENCH_CACHE_DIR`` turns it off."""
    given = os.environ.get(ENV_DIR)
    if given is not None:
        return None if given.strip().lower() in _OFF or not given.strip() else Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ckptbench"


def max_bytes() -> int:
    given = os.environ.get(ENV_MAX, "")
    try:
        return max(0, int(given)) if given.strip() else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class TraceFailed:
    """A trace this code and these libraries refuse (``TechniqueUnavailable``: a technique the estimator does not
    trace), kept so that asking again does not import torch to be refused again."""

    why: str


@dataclass(frozen=True)
class CacheSize:
    """What a cache folder holds: entries and bytes, this version's and in all."""

    root: Path
    entries: int
    bytes: int
    current_entries: int
    current_bytes: int


@dataclass(frozen=True)
class TraceCache:
    """The traces of one root folder (``default_root``); ``limit``: the bound on its bytes."""

    root: Path
    limit: int = DEFAULT_MAX_BYTES

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def version_dir(self) -> Path:
        return self.traces / _digest(repr(versions()))

    def marker(self, subject: str) -> Path:
        """The file that says a command on ``subject`` answered with this cache (estimator/tracer.py)."""
        return self.traces / "asked" / f"{_digest(subject)}{_MARKER}"

    def _path(self, key_text: str) -> Path:
        name = _digest(key_text)
        return self.version_dir / name[:2] / f"{name}.pickle"

    def get(self, key: Hashable) -> Any | None:
        """The value kept under ``key`` by this version, or None (absent, another version's, unreadable)."""
        text = repr(key)
        path = self._path(text)
        try:
            with path.open("rb") as f:
                found = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # a damaged or foreign file: as if absent (it is replaced when written again)
            return None
        if not (isinstance(found, tuple) and len(found) == 3 and found[0] == versions() and found[1] == text):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # least recently used goes first when the bound is reached
        return found[2]

    def put(self, key: Hashable, value: Any) -> None:
        """Keep ``value`` under ``key``, written atomically; a disk or a value that refuses costs only the cache."""
        self._grew(self._write(key, value))

    def put_many(self, items: Iterable[tuple[Hashable, Any]]) -> None:
        """``put`` of each (key, value), counted together."""
        self.count(self.write_many(items))

    def write_many(self, items: Iterable[tuple[Hashable, Any]]) -> int:
        """Each (key, value) written as ``put`` writes it, not yet counted in the folder's size: the bytes written,
        for ``count`` (a forked worker writes what it made; the command counts it once, with the folder's bound)."""
        return sum(self._write(key, value) for key, value in items)

    def count(self, nbytes: int) -> None:
        """``nbytes`` written by ``write_many`` counted in the folder's size (past the bound, the bound kept)."""
        self._grew(nbytes)

    def _write(self, key: Hashable, value: Any) -> int:
        """Write one entry; the bytes written (0 when the disk or the value refused)."""
        text = repr(key)
        path = self._path(text)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    pickle.dump((versions(), text, value), f, protocol=pickle.HIGHEST_PROTOCOL)
                    written = f.tell()
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except Exception:  # a full or read-only disk, a value pickle refuses: the cache's loss, not the answer's
            return 0
        return written

    @property
    def _count(self) -> Path:
        return self.traces / "size"

    def _grew(self, nbytes: int) -> None:
        """Count ``nbytes`` more in the folder; past the bound, or with no count yet, walk it and keep the bound."""
        if nbytes <= 0:
            return
        try:
            held: int | None = int(self._count.read_text()) + nbytes
        except (OSError, ValueError):  # none yet, or being written by another command
            held = None
        if held is None or held > self.limit:
            held = self._bound()
        with contextlib.suppress(OSError):
            self._count.write_text(str(held))

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()``, kept under ``key``: computed once per version."""
        found = self.get(key)
        if found is None:
            found = compute()
            self.put(key, found)
        return found

    def _files(self) -> list[tuple[Path, os.stat_result]]:
        out = []
        for path in self.traces.rglob("*.pickle") if self.traces.is_dir() else ():
            with contextlib.suppress(OSError):
                out.append((path, path.stat()))
        return out

    def _bound(self) -> int:
        """Past ``limit``: remove other versions' entries, then the least recently used, down to 80% of it. The bytes
        the folder holds after."""
        files = self._files()
        total = sum(st.st_size for _, st in files)
        if total <= self.limit:
            return total
        current = self.version_dir
        files.sort(key=lambda f: (f[0].is_relative_to(current), f[1].st_mtime))
        for path, st in files:
            if total <= self.limit * 0.8:
                break
            with contextlib.suppress(OSError):
                path.unlink()
                total -= st.st_size
        self._remove_empty_dirs()
        return total

    def _remove_empty_dirs(self) -> None:
        for d in sorted((p for p in self.traces.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()  # only empty ones go

    def size(self) -> CacheSize:
        files = self._files()
        current = [st.st_size for p, st in files if p.is_relative_to(self.version_dir)]
        return CacheSize(self.root, len(files), sum(st.st_size for _, st in files), len(current), sum(current))

    def clear(self) -> CacheSize:
        """Remove every entry (of every version) and the temporary files of interrupted writes; what was removed."""
        before = self.size()
        for path in self.traces.rglob("*") if self.traces.is_dir() else ():
            if path.is_file() and (path.suffix in (".pickle", _MARKER) or path.name.endswith(".tmp")
                                   or path == self._count):
                with contextlib.suppress(OSError):
                    path.unlink()
        self._remove_empty_dirs()
        with contextlib.suppress(OSError):
            self.traces.rmdir()
        return before


def default_cache() -> TraceCache | None:
    """The cache commands use (``default_root``, bounded by ``CKPTBENCH_CACHE_MAX_BYTES``), or None when off."""
    root = default_root()
    return None if root is None else TraceCache(root, max_bytes())
