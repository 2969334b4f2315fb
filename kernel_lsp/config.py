"""Settings: defaults < `[tool.kernel-lsp]` in pyproject.toml < LSP initializationOptions
< `workspace/configuration` (section `kernelLsp`) < environment for secrets.

Keys are accepted in snake_case (pyproject) and camelCase (editors); nested editor
sections (`execution.enabled`, `agent.model`) are flattened the same way.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHECKS = ("compile", "verify", "bench")
PROPOSERS = ("auto", "llm", "tuner")
SANDBOX_MODES = ("required", "auto", "off")  # engine/caller/sandbox.py; docs/sandbox.md
EXECUTORS = ("local", "ray")
SEEDS = ("none", "inductor")  # agent/seed.py; docs/agent.md "The torch.compile seed"


class SettingsError(ValueError):
    """A setting has a value of the wrong kind; the message names the setting."""


@dataclass
class Settings:
    nvcc: str | None = None                 # None: $CUDA_HOME/bin, PATH, /usr/local/cuda/bin
    arch: str | None = None                 # None: the visible GPU's, else sm_90
    extra_flags: list[str] = field(default_factory=list)
    include_paths: list[str] = field(default_factory=list)
    on_save: list[str] = field(default_factory=lambda: ["compile"])
    build_while_typing: bool = True         # a measured file's edits are built after a pause, before the save
    occupancy_threshold: float = 0.25       # warn below this theoretical occupancy
    execution_enabled: bool = True          # run harness and candidate code (off: compile only)
    python: str | None = None               # interpreter for engine Workers (needs torch)
    device: str | None = None               # CUDA device index for the Worker
    timeout: float = 120.0                  # seconds per candidate evaluation
    proposer: str = "auto"                  # auto: llm when a model is configured, else tuner
    agent_model: str | None = None
    agent_base_url: str | None = None
    agent_budget: int = 24                  # proposals per Search (and at most 32 evaluations)
    # An LLM Search over a PyTorch module on a GPU first verifies and times the file torch.compile's
    # kernels make (one torch.compile, ~20 s on the H200) and builds on it; "none": from the start alone.
    agent_seed: str = "inductor"
    slow_share: float = 0.3                 # a hot op above this share of forward gets a note
    sandbox: str = "auto"                   # required | auto | off: fence the Workers that run candidates
    whole_model_min_share: float = 0.05     # optimize --whole-model: ops below this share are left alone
    kernels_only: bool = False              # a PyTorch rewrite never counts (KernelBench-style scoring)
    accept_less_accurate: bool = False      # a `less_accurate` candidate counts (docs/correctness.md)
    executor: str = "local"                 # where Workers live: "local" subprocesses or a "ray" cluster
    ray_address: str | None = None          # any address ray.init accepts: "ray://host:10001", "host:6379", "auto"
    gpu: str | None = None                  # GPU kind a candidate must be timed on (Ray), e.g. "H100"
    max_gpus: int = 0                       # GPU actors one Search may use (Ray); 0: all in the cluster

    def merged(self, raw: dict[str, Any] | None) -> "Settings":
        """A copy with `raw` (any supported spelling) laid over this one."""
        if not raw:
            return dataclasses.replace(self)
        values = dataclasses.asdict(self)
        for key, value in _flatten(raw).items():
            name = _snake(key)
            name = _ALIASES.get(name, name)
            if name not in values:
                continue  # unknown keys are ignored, as editors send their own extras
            values[name] = _coerce(name, value, values[name])
        return Settings(**values)

    @property
    def effective_arch(self) -> str:
        return self.arch or detect_arch() or "sm_90"

    def effective_proposer(self) -> str:
        if self.proposer != "auto":
            return self.proposer
        return "llm" if (self.agent_model or os.environ.get("KERNEL_LSP_MODEL")) else "tuner"


_ALIASES = {
    "execution": "execution_enabled",
    "execution_enabled": "execution_enabled",
    "model": "agent_model",
    "base_url": "agent_base_url",
    "budget": "agent_budget",
    "seed": "agent_seed",
    "flags": "extra_flags",
    "include_dirs": "include_paths",
}


def _flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"{prefix}_{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(_flatten(value, full))
        else:
            out[full] = value
    return out


def _snake(key: str) -> str:
    key = key.replace("-", "_").replace(".", "_")
    key = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key).lower()
    return key.removeprefix("kernel_lsp_")


def _coerce(name: str, value: Any, current: Any) -> Any:
    if value is None:
        return None if name in _OPTIONAL else current
    default = _DEFAULTS[name]
    if isinstance(default, list):
        if isinstance(value, str):
            value = value.split()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SettingsError(f"setting '{name}' must be a list of strings, got {value!r}")
        if name == "on_save":
            bad = [v for v in value if v not in CHECKS]
            if bad:
                raise SettingsError(f"setting 'on_save' accepts {', '.join(CHECKS)}; got {', '.join(bad)}")
        return list(value)
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        if not isinstance(value, bool):
            raise SettingsError(f"setting '{name}' must be true or false, got {value!r}")
        return value
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            number = type(default)(value)
        except (TypeError, ValueError):
            raise SettingsError(f"setting '{name}' must be a number, got {value!r}") from None
        if number < 0:
            raise SettingsError(f"setting '{name}' must not be negative, got {value!r}")
        return number
    if name == "proposer" and value not in PROPOSERS:
        raise SettingsError(f"setting 'proposer' accepts {', '.join(PROPOSERS)}; got {value!r}")
    if name == "sandbox" and value not in SANDBOX_MODES:
        raise SettingsError(f"setting 'sandbox' accepts {', '.join(SANDBOX_MODES)}; got {value!r}")
    if name == "agent_seed" and value not in SEEDS:
        raise SettingsError(f"setting 'agent.seed' accepts {', '.join(SEEDS)}; got {value!r}")
    if name == "executor" and value not in EXECUTORS:
        raise SettingsError(f"setting 'executor' accepts {', '.join(EXECUTORS)}; got {value!r}")
    if name == "arch" and value and not re.fullmatch(r"(sm|compute)_\d+[af]?", str(value)):
        raise SettingsError(f"setting 'arch' must look like sm_90, got {value!r}")
    return str(value) if value != "" else (None if name in _OPTIONAL else current)


_DEFAULTS = dataclasses.asdict(Settings())
_OPTIONAL = {name for name, value in _DEFAULTS.items() if value is None}


def read_pyproject(root: str | os.PathLike[str] | None) -> dict[str, Any]:
    """`[tool.kernel-lsp]` from the nearest pyproject.toml at or above `root`."""
    if root is None:
        return {}
    here = Path(root).resolve()
    for folder in (here, *here.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            try:
                data = tomllib.loads(candidate.read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise SettingsError(f"{candidate}: cannot read [tool.kernel-lsp]: {exc}") from exc
            return dict(data.get("tool", {}).get("kernel-lsp", {}))
    return {}


def load_settings(root: str | os.PathLike[str] | None = None, *overlays: dict[str, Any] | None) -> Settings:
    settings = Settings().merged(read_pyproject(root))
    for overlay in overlays:
        settings = settings.merged(overlay)
    return settings


_ARCH: list[str | None] = []


def detect_arch() -> str | None:
    """The build target of the first visible GPU through nvidia-smi, without importing torch:
    the one the GPU Worker builds for (toolchain.nvcc.device_arch: sm_90a on an H100 or H200
    where nvcc compiles it), so that a build made ahead in the CPU pool is the Worker's."""
    if _ARCH:
        return _ARCH[0]
    import shutil
    import subprocess

    arch = None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=5,
            ).stdout.split()
            if out and re.fullmatch(r"\d+\.\d+", out[0]):
                from kernel_lsp.toolchain.nvcc import capability_arch

                arch = capability_arch(out[0])
        except (OSError, subprocess.SubprocessError):
            arch = None
    _ARCH.append(arch)
    return arch
