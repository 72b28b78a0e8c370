"""The sim_ttft suite figures: prefill-aware K's trade-off on the serving simulator, one simulate
stage per setting: adaptive's prompt weight (runtime/policy/prefill_price.py; stages ttft_<w>, each
`--ttft-weight w`) and the dynamic schedule's prefill cap (runtime/policy/prefill_cap.py; stages
prefill_k_<k>, each `--prefill-k k`, prefill_k_none without). Per setting, load and drafting mode:
sustained tok/s and TTFT p50 / p99, each over the baseline's at the same load (the baseline reads
neither setting)."""
from __future__ import annotations

from typing import Mapping, Sequence

from dynspec.errors import DynspecError

PREFIXES = ("ttft_", "prefill_k_")


def stage_names(names: Sequence[str]) -> list[str]:
    return [n for n in names if n.startswith(PREFIXES)]


def setting_of(flags: Sequence[str], where: str) -> str:
    """A simulate stage's setting from its sweep flags: 'weight 64' (--ttft-weight; 'weight 64,
    catch-up unpriced' with --catch-up-price off), 'prefill-k 0' (--prefill-k), 'uncapped' (a
    dynamic stage with neither)."""
    flags = list(flags)
    unpriced = ", catch-up unpriced" if "--catch-up-price" in flags[:-1] and \
        flags[flags.index("--catch-up-price") + 1] == "off" else ""
    for flag, label in (("--ttft-weight", "weight"), ("--prefill-k", "prefill-k")):
        if flag in flags:
            try:
                return f"{label} {float(flags[flags.index(flag) + 1]):g}{unpriced}"
            except (ValueError, IndexError):
                raise DynspecError(f"{where}: its flags {' '.join(flags)!r} give {flag} without a number") from None
    modes = flags[flags.index("--modes") + 1].split(",") if "--modes" in flags[:-1] else []
    if "dynamic" in modes:
        return "uncapped"
    raise DynspecError(f"{where}: its flags {' '.join(flags)!r} give no --ttft-weight W (adaptive) or dynamic mode")


def ttft_figures(docs: Mapping[str, dict]) -> dict:
    """{stage: simulate's JSON} -> {"values", "table", "plot"} (benchmarks/suite_report.py)."""
    rows = []
    for name, doc in docs.items():
        w = setting_of(doc["flags"], name)
        base = {_load(r): r for r in doc["rows"] if r["mode"] == "baseline"}
        for r in doc["rows"]:
            b = base.get(_load(r))
            if r["mode"] == "baseline" or b is None:
                continue
            rows.append({"setting": w, "load": _load(r), "mode": r["mode"], "tok_per_s": r["output_tok_per_s"],
                         "tok_ratio": r["output_tok_per_s"] / b["output_tok_per_s"],
                         "p50_ttft_ms": _ms(r["p50_ttft_s"]), "p99_ttft_ms": _ms(r["p99_ttft_s"]),
                         "p50_ttft_ratio": _ratio(r["p50_ttft_s"], b["p50_ttft_s"]),
                         "p99_ttft_ratio": _ratio(r["p99_ttft_s"], b["p99_ttft_s"]),
                         "baseline_p50_ttft_ms": _ms(b["p50_ttft_s"]), "mean_k": r["mean_k"]})
    rows.sort(key=lambda r: (r["mode"], r["load"], _order(r["setting"])))
    header = ["mode", "load", "setting", "tok/s", "x baseline", "TTFT p50 ms", "p50 x baseline", "TTFT p99 ms",
              "p99 x baseline", "mean K"]
    body = [[r["mode"], r["load"], r["setting"], f"{r['tok_per_s']:.0f}", f"{r['tok_ratio']:.3f}",
             _show(r["p50_ttft_ms"]), _show(r["p50_ttft_ratio"], ".2f"), _show(r["p99_ttft_ms"]),
             _show(r["p99_ttft_ratio"], ".2f"), f"{r['mean_k']:.2f}"] for r in rows]
    series: dict = {}
    for r in rows:
        if r["p50_ttft_ratio"] is not None:
            y = r["p50_ttft_ratio"]
            series.setdefault(f"{r['mode']} {r['load']}", []).append([r["tok_ratio"], y, y, y])
    plot = {"title": "simulated: prefill-aware K's trade-off (points: settings, each over the baseline)",
            "x": "sustained tok/s / baseline", "y": "TTFT p50 / baseline", "series": series}
    notes = ["Simulated (benchmarks/simulate.py): one run per setting on the recorded device's profile and step "
             "prices; the GPU's effect is measured by the serving configs."]
    return {"values": {"rows": rows}, "table": {"header": header, "rows": body, "notes": notes}, "plot": plot}


def _load(r: dict) -> str:
    return f"C={r['concurrency']}" if r.get("concurrency") is not None else f"poisson~C={r['matched_concurrency']}"


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _show(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _order(setting: str) -> tuple:
    """Table order within a mode and load: weights ascending (each unpriced first); uncapped, then caps
    descending."""
    label, _, v = setting.partition(" ")
    v, _, unpriced = v.partition(",")
    return (0, float(v), not unpriced) if label == "weight" else (1, 0.0, 0) if label == "uncapped" else (2, -float(v), 0)
