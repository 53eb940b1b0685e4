"""A sweep's runner: check its options and that this machine can run the config, then build the runner."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from ckptbench.config.cluster import ClusterSpec
from ckptbench.config.schema import SweepConfig, check_cpu_compatible
from ckptbench.errors import CkptbenchError, ConfigError, EnvironmentError_
from ckptbench.measure import faults
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.environment import collect as collect_environment
from ckptbench.measure.runner import Runner
from ckptbench.processes.fanout import fanout_runner
from ckptbench.processes.isolate import IsolatedRunner


def check_options(*, out: Path | None, resume: Path | None, isolate: bool, timeout_s: float | None) -> None:
    if resume is not None and out is not None:
        raise ConfigError("--resume continues RUN_DIR in place; it cannot be combined with --out")
    if timeout_s is not None and not isolate:
        raise ConfigError("--point-timeout needs --isolate (only a point's own process can be stopped)")
    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"--point-timeout must be a positive number of seconds, got {timeout_s:g}")


def make_runner(
    cfg: SweepConfig, *, isolate: bool, timeout_s: float | None, cluster: ClusterSpec | None = None
) -> tuple[Runner, dict[str, Any]]:
    """Check that this machine can run ``cfg`` and build the runner; nothing is written yet."""
    if cluster is not None and cluster.executor == "slurm" and shutil.which("sbatch") is None:
        raise EnvironmentError_(
            "--executor slurm: no Slurm here (sbatch is not on PATH); run the sweep from a Slurm login node, "
            "or use --executor local"
        )
    if cluster is not None and cluster.executor != "none":
        return fanout_runner(cfg, cluster, timeout_s=timeout_s)
    device = resolve_device(cfg)
    if device.type == "cpu":
        try:
            check_cpu_compatible(cfg)
        except ValueError as exc:
            raise ConfigError(f"{exc} (device {cfg.device!r} runs on the CPU here)") from None
    environment = collect_environment(device.type, cpu_threads=cfg.cpu_threads)
    probe = make_probe(cfg, device)
    environment["probe"] = probe.kind
    if faults.active():  # a run measured with fault hooks says so for good
        environment["test_hooks"] = faults.active()
    try:  # the runner builds the LlamaConfig: it checks the override values before anything is created
        gpu_name = environment.get("gpu_name")
        runner = (
            IsolatedRunner(cfg, device, probe, gpu_name, point_timeout_s=timeout_s)
            if isolate
            else Runner(cfg, device, probe, gpu_name=gpu_name)
        )
    except CkptbenchError:
        raise
    except Exception as exc:  # LlamaConfig's own checks of model.overrides (types, head counts...)
        text = " ".join(str(exc).split()) or exc.__class__.__name__
        raise ConfigError(f"model.overrides: transformers' LlamaConfig rejects them: {text[:200]}") from None
    return runner, environment
