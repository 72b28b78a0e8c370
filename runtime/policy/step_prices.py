"""Step prices the profile does not time, fitted on served GPU runs (benchmarks/sim_fit.py;
docs/design.md, "The serving simulator"), and their file: one reader for the simulator, the sweeps
and the per-request policy.

    {"device": "NVIDIA H100 80GB HBM3", "fitted_on": ["h100-6e9fc00"], "features": [...],
     "prices": {"host_ms": 0.32, "chunk_fixed_ms": -2.0, "chunk_ms_per_token": 0.030,
                "draft_chunk_ms_per_token": 0.0037, "ragged_factor": 1.20}}

host_ms: serial host time inside each profiled step (the overlapped loop hides it); chunk_*: a step
with prompt chunks over its rows' profiled time (fixed + per token; None: the plain-step curve's
slope); draft_chunk_ms_per_token: a drafting mode's draft pass over each chunk token;
ragged_factor: a per-row K vector's step over its split price (runtime/policy/split_cost.py); null
where the runs fitted held no per-row step (not measured on that device: the policies then price
per-row vectors at UNMEASURED_RAGGED, policy_ragged). The cost-model policies take a device's prices
(runtime/policy/__init__.py PolicyKind.make): per-row vectors at policy_ragged, and a prompt chunk at
its chunk prices where the profile has no chunk axis (chunk_cost.FittedChunk). Served and swept
policies read step_prices.json beside the engine's cost_model.json (prices_beside), the sweep's
--step-prices before it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dynspec.errors import DynspecError

STEP_PRICES = "step_prices.json"      # its name in an engine dir
# A per-row vector on a device whose per-row steps were never measured: priced at 4x its split, it
# stands almost nowhere, and per-request runs as the batch-level policy plus its probes. Measured:
# 1.20 on the H100; on an H200 priced at 1.0, per-request served 0.70x baseline at C=256
# (docs/design.md, "Why the tuned schedule still loses at C = 256").
UNMEASURED_RAGGED = 4.0
MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class StepPrices:
    host_ms: float = 0.0
    chunk_fixed_ms: float = 0.0
    chunk_ms_per_token: float | None = None
    draft_chunk_ms_per_token: float = 0.0
    ragged_factor: float | None = 1.0     # None: not measured on the device (module docstring)

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise DynspecError(f"step prices: {k} = {v!r} is not a finite number")
        if self.ragged_factor is not None and not 0.5 <= self.ragged_factor <= 4.0:
            raise DynspecError(f"step prices: ragged_factor {self.ragged_factor} is outside 0.5..4")


FIELDS = tuple(StepPrices.__dataclass_fields__)


def write(path: os.PathLike, prices: StepPrices, device: str, fitted_on: list[str], features: list[str]) -> None:
    """The prices file, written whole under a temporary name, then renamed."""
    from dynspec.artifacts import write_text

    doc = {"device": device, "fitted_on": fitted_on, "features": features, "prices": asdict(prices)}
    write_text(path, json.dumps(doc, indent=1) + "\n")


def read(path: os.PathLike) -> tuple[StepPrices, str, list[str]]:
    """(prices, device, the data dirs they were fitted on); one DynspecError line for any fault."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        p = doc["prices"]
        prices = StepPrices(**{k: (None if p.get(k) is None else float(p[k])) for k in FIELDS})
        return prices, str(doc["device"]), [str(x) for x in doc["fitted_on"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DynspecError(f"{path}: not a step-prices file ({type(e).__name__}: {e})") from None


def for_device(path: os.PathLike, device: str) -> StepPrices | None:
    """The prices of `device` (torch.cuda.get_device_name, or "cpu"): a file must be that device's
    (else one DynspecError line); a folder gives its *_prices.json of that device, None if it has
    none (benchmarks/sim_data: h100_prices.json, h200_prices.json)."""
    p = Path(path)
    if p.is_dir():
        for f in sorted(p.glob("*_prices.json")):
            prices, dev, _ = read(f)
            if dev == device:
                return prices
        return None
    prices, dev, _ = read(p)
    if dev != device:
        raise DynspecError(f"{p}: step prices of {dev!r}, and this engine runs on {device!r}")
    return prices


def profiled_device(label: str) -> str:
    """A profile's device label as for_device takes it: 'cuda (NVIDIA H100 80GB HBM3)' (benchmarks/
    engines.device_name) -> 'NVIDIA H100 80GB HBM3'; 'cpu' -> 'cpu'."""
    _, sep, rest = label.partition(" (")
    return rest[:-1] if sep and rest.endswith(")") else label


def policy_ragged(prices: StepPrices | None) -> float:
    """The factor the per-request policies price per-row vectors at: the measured one, else
    UNMEASURED_RAGGED; no prices at all: 1.0 (their split price)."""
    if prices is None:
        return 1.0
    return UNMEASURED_RAGGED if prices.ragged_factor is None else prices.ragged_factor


def prices_beside(cost_model_path: os.PathLike) -> StepPrices | None:
    """step_prices.json beside a cost model (an engine dir's), None where there is none."""
    p = Path(cost_model_path).with_name(STEP_PRICES)
    return read(p)[0] if p.is_file() else None


def policy_record(prices: StepPrices | None) -> dict:
    """What a run's cost-model policies were priced with, for its env block (the replay reads it back:
    benchmarks/sim_record.py): {"ragged_factor": policy_ragged, "step_prices": the prices or None}."""
    return {"ragged_factor": policy_ragged(prices),
            "step_prices": None if prices is None else asdict(prices)}
