"""The options of one evaluation, typed: what `run.evaluate` and `verify` read.

Callers (the Engine, the CLI, the agent) send a plain dict over the Worker protocol; it is
read here once, each key coerced to its type, so a wrong value is one clear error and a
misspelt key is not silently a default. The dict itself still goes to the builder (it reads
`arch`, `flags`, `nvcc`) and to ncu's subprocess.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


class OptionsError(ValueError):
    """An engine option with a value of the wrong kind; the message names it."""


@dataclass(frozen=True)
class EngineOptions:
    seed: int = 42
    input_sets: int = 3                  # fresh input sets for verify (at least 2)
    device: str | None = None            # None: "cuda" when visible, else "cpu"
    atol: float | None = None            # None: the Task's, else the dtype's default
    rtol: float | None = None
    oracle: bool = True                  # judge against a float64 run of the reference (docs/correctness.md)
    accept_less_accurate: bool = False   # a `less_accurate` candidate counts (the accept_less_accurate setting)
    baselines: bool = True               # time eager and torch.compile of the reference
    compile_mode: str = "default"        # torch.compile mode of the baseline
    runs: int = 20                       # at least this many timed calls
    warmup: int = 5
    max_runs: int = 2000
    bench_seconds: float = 1.0           # time budget per timed callable
    bench_min_seconds: float = 0.25      # ... of which at least this much (bench.Settle)
    bench_precision_pct: float = 0.5     # stop once every median's 95 % interval is this close; 0: never
    rotate_sets: int = 4                 # input sets the timed calls cycle through
    rotate_bytes: int = 512 << 20        # ... within this many bytes of inputs
    cache_probe: bool = True             # calls on never-seen inputs against repeated ones
    # Send the verdict and the eager ratio as a partial result before torch.compile compiles
    # (protocol.EARLY_RESULT; the Engine sets it when its caller takes them).
    early_result: bool = False
    cpu_threads: int = 1                 # torch threads while timing on the CPU
    ncu: bool = True                     # profile the candidate's kernels with Nsight Compute
    top: int = 10                        # hot ops kept in a profile
    profile_timeout: float = 300.0
    arch: str | None = None              # for the builder
    flags: list[str] = field(default_factory=list)
    nvcc: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # as sent

    @classmethod
    def of(cls, value: "EngineOptions | dict[str, Any] | None") -> "EngineOptions":
        return value if isinstance(value, EngineOptions) else cls.from_dict(value)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> "EngineOptions":
        raw = dict(raw or {})
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "raw" or f.name not in raw or raw[f.name] is None:
                continue
            values[f.name] = _coerce(f.name, raw[f.name], _DEFAULTS[f.name])
        return cls(raw=raw, **values)


def _coerce(name: str, value: Any, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                return value.lower() in ("true", "1")
            return bool(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float) or name in ("atol", "rtol"):
            return float(value)
        if isinstance(default, list):
            if isinstance(value, str):
                return value.split()
            return [str(v) for v in value]
        return str(value)
    except (TypeError, ValueError):
        raise OptionsError(f"engine option {name!r} cannot be {value!r}") from None


_DEFAULTS = {f.name: (f.default if f.default is not dataclasses.MISSING else f.default_factory())  # type: ignore[misc]
             for f in dataclasses.fields(EngineOptions)}
