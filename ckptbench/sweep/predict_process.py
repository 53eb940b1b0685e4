"""``python -m ckptbench.sweep.predict_process``: a sweep's predictions, made in the background.

Reads one JSON request line on stdin ({config, keys, target}) and writes one JSON line per point to
stdout ({key_id, fields}: the predicted record fields) as soon as its traces have run, then
{done, elapsed_s}; or {error}. The request's optional ``gpu`` is the sweep's card (estimator/gpus.py
GpuModel's fields): this process sees no GPU.
The estimator is imported before the request is read, so the import overlaps the sweep's own start-up.
stdin's end (the sweep closed it, or died) ends this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

from ckptbench.json_object import JsonObject


def _send(msg: JsonObject) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _exit_when_stdin_ends() -> None:
    """The sweep holds stdin open while it runs: its end means nobody waits for the predictions."""

    def watch() -> None:
        while sys.stdin.readline():
            pass
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="ckptbench-stdin-watch").start()


def main() -> int:
    with contextlib.suppress(OSError):
        os.nice(10)  # lower priority: the sweep's own process keeps the CPU it needs to drive the GPU
    from ckptbench.config.grid import Point
    from ckptbench.config.load import parse_config
    from ckptbench.estimator.estimator import iter_predictions
    from ckptbench.estimator.gpus import GpuModel

    line = sys.stdin.readline()
    if not line:
        return 0  # the sweep ended (or ran on CPU) before asking
    started = time.monotonic()
    _exit_when_stdin_ends()
    try:
        request = json.loads(line)
        cfg = parse_config(request["config"], source="background prediction config")
        points = [Point.from_key(key) for key in request["keys"]]
        card = request.get("gpu")
        gpu = GpuModel(**{**card, "capability": tuple(card["capability"])}) if card else None
        for key_id, prediction in iter_predictions(cfg, points, target=request["target"], gpu=gpu):
            _send({"key_id": key_id, "fields": prediction.to_json()})
    except Exception as exc:  # reported to the sweep, which records its points without predictions
        _send({"error": f"{exc.__class__.__name__}: {exc}"})
        return 1
    _send({"done": True, "elapsed_s": time.monotonic() - started})
    return 0


if __name__ == "__main__":
    sys.exit(main())
