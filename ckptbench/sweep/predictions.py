"""Each point's predictions (ckptbench estimate: peak allocated, peak reserved or the predicted OOM),
made before the point runs, kept in its record.

On CUDA the predictions are made in a background CPU process (``python -m ckptbench.sweep.predict_process``)
while the GPU measures, so they add no wall time: the process is started as early as possible (the CLI
starts it before importing torch), imports the estimator while the sweep probes the machine, and
streams one prediction per point in the order the points run. When a point starts before its
prediction has arrived, the sweep waits for it (the waits are counted in run.json's timing), so every
recorded prediction was made before its point ran; after MAX_WAIT_S of waiting in all, points run
without one instead. On CPU the device *is* the CPU: a concurrent estimator would slow the very steps
being measured, so the predictions are made up front, in this process.

Torch-free at import: the CLI imports it before torch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

import ckptbench
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.json_object import JsonObject
from ckptbench.results.record import Prediction

if TYPE_CHECKING:
    from ckptbench.estimator.gpus import GpuModel
    from ckptbench.measure.runner import Predictions

# The longest a sweep waits for predictions, all points together; the estimator is an aid, never a
# reason for a measured run to stall (a 7B sweep's predictions take about 10 s in all).
MAX_WAIT_S = 60.0


def predict_in_process(
    cfg: SweepConfig, points: Sequence[Point], *, target: str, gpu: GpuModel | None = None
) -> tuple[dict[str, Prediction], str | None]:
    """Predictions of ``points`` made here and now, and why there are none (None when they were made)."""
    try:
        from ckptbench.estimator.estimator import predict_records

        return predict_records(cfg, points, target="cuda" if target == "cuda" else "cpu", gpu=gpu), None
    except Exception as exc:  # the estimator is an aid; a failure in it must not cost a measured run
        return {}, f"no predictions recorded: {exc.__class__.__name__}: {exc}"


class BackgroundPredictions:
    """Predictions streamed by a background process; ``get`` waits (within MAX_WAIT_S) for one not yet made."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._values: dict[str, Prediction] = {}
        self._requested: set[str] = set()
        self._cond = threading.Condition()
        self._finished = False
        self.error: str | None = None
        self.wait_s = 0.0  # how long points waited for their prediction, in all
        self.missing = 0  # points that ran without their prediction (waited MAX_WAIT_S in all)
        self.background_s: float | None = None  # the process's time from request to last prediction
        self._reader = threading.Thread(target=self._read, daemon=True, name="ckptbench-predictions")
        self._reader.start()

    @classmethod
    def start(cls) -> BackgroundPredictions:
        """Start the process now; it imports the estimator while it waits for ``request``."""
        env = dict(os.environ)
        package_root = str(Path(ckptbench.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        # Fake tensors need no GPU: hiding it keeps the process from creating a CUDA context, which would
        # take memory on the card being measured.
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["OMP_NUM_THREADS"] = "1"  # fake tensors compute nothing; keep the host's cores for the sweep
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptbench.sweep.predict_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep only, which then ends this
        )
        return cls(proc)

    def request(
        self, cfg: SweepConfig, points: Sequence[Point], *, target: str, gpu: GpuModel | None = None
    ) -> None:
        """Ask for the predictions of ``points`` (in the order they will run) for ``target``, on ``gpu``
        (this card's model: the process sees no GPU, CUDA_VISIBLE_DEVICES is empty there)."""
        self._requested = {p.key_id for p in points}
        msg = {"config": cfg.model_dump(mode="json"), "keys": [p.key for p in points], "target": target}
        if gpu is not None:
            msg["gpu"] = dataclasses.asdict(gpu)
        line = json.dumps(msg)
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()  # stdin stays open: its end tells the process the sweep is gone
        except OSError as exc:
            self._finish(f"the prediction process is gone ({exc.__class__.__name__})")

    def get(self, key_id: str, /) -> Prediction | None:
        if key_id not in self._requested:
            return None  # a search probe: never asked for
        with self._cond:
            if key_id not in self._values and not self._finished and self.wait_s < MAX_WAIT_S:
                t0 = time.monotonic()
                self._cond.wait_for(lambda: key_id in self._values or self._finished, MAX_WAIT_S - self.wait_s)
                self.wait_s += time.monotonic() - t0
            if key_id not in self._values:
                self.missing += 1
            return self._values.get(key_id)

    def _read(self) -> None:
        out: IO[str] | None = self.proc.stdout
        for line in out or ():
            with contextlib.suppress(ValueError):
                self._take(json.loads(line))
        self._finish("the prediction process ended early")

    def _take(self, msg: JsonObject) -> None:
        with self._cond:
            if "key_id" in msg:
                self._values[msg["key_id"]] = Prediction.model_validate(msg["fields"])
            elif "done" in msg:
                self.background_s = msg.get("elapsed_s")
                self._finished = True
            elif "error" in msg:
                self.error = f"no predictions recorded: {msg['error']}"
                self._finished = True
            self._cond.notify_all()

    def _finish(self, why: str) -> None:
        with self._cond:
            if not self._finished:
                self.error = self.error or f"predictions incomplete: {why}"
                self._finished = True
            self._cond.notify_all()

    def close(self) -> None:
        """End the process (done or not) and collect it."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=5)

    def notes(self) -> list[str]:
        """What a user should know: predictions that failed or came too late for some points."""
        out = [self.error] if self.error and len(self._values) < len(self._requested) else []
        if self.missing:
            out.append(f"{self.missing} point(s) ran without a prediction: it was not ready after {MAX_WAIT_S:g} s")
        return out


def start_background(cfg: SweepConfig, *, predict: bool) -> BackgroundPredictions | None:
    """Start the background prediction process early, when the sweep will likely run on CUDA.

    Decided before torch is imported: 'device: cuda', or 'auto' on a host with an NVIDIA driver. A wrong
    guess costs little: run_sweep ends an unneeded process, or starts a missing one itself.
    """
    likely_cuda = cfg.device == "cuda" or (cfg.device == "auto" and Path("/dev/nvidiactl").exists())
    if not predict or not likely_cuda:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return BackgroundPredictions.start()
        except OSError:
            return None  # the sweep makes them in-process instead


def choose_predictions(
    cfg: SweepConfig, todo: Sequence[Point], *, target: str, predict: bool, background: bool | None,
    predictor: BackgroundPredictions | None, gpu: GpuModel | None = None,
) -> tuple[Predictions, BackgroundPredictions | None, list[str]]:
    """The runner's predictions: made in the background on CUDA (``background`` None decides by
    ``target``), else here before the points; also the background process and notes for the user."""
    if predict and (background if background is not None else target == "cuda"):
        bg = predictor or BackgroundPredictions.start()
        bg.request(cfg, todo, target=target, gpu=gpu)
        return bg, bg, []
    if predictor is not None:
        predictor.close()  # started early for a sweep that turned out to run on the CPU
    if not predict:
        return {}, None, []
    values, why = predict_in_process(cfg, todo, target=target, gpu=gpu)
    return values, None, [why] if why else []
