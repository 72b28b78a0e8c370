"""The prefill-aware K figures: the trade-off between sustained tok/s and time to first token over
settings of adaptive's prompt weight (runtime/policy/prefill_price.py; `--ttft-weight w`) and the
dynamic schedule's prefill cap (runtime/policy/prefill_cap.py; `--prefill-k k`, uncapped without).
Two sources, one table: sim_ttft's simulate stages (ttft_<w>, prefill_k_<k>: the serving
simulator) and serving_ttft's sweep cases (sweep_<case>: measured on a GPU, trials paired). Per
setting, load and drafting mode: sustained tok/s and TTFT p50 / p99, each over the baseline's at
the same load and in the same run (the baseline reads neither setting)."""
from __future__ import annotations

import shlex
from typing import Mapping, Sequence

from dynspec.benchmarks.figures_common import paired_ratio
from dynspec.benchmarks.sweep_modes import SERIAL, split_mode
from dynspec.errors import DynspecError

PREFIXES = ("ttft_", "prefill_k_")       # sim_ttft's simulate stages (serving_ttft's: summary.sweep_stage_names)


def stage_names(names: Sequence[str]) -> list[str]:
    return [n for n in names if n.startswith(PREFIXES)]


def flags_of(doc: Mapping, where: str) -> list[str]:
    """A stage's sweep flags: simulate's JSON carries them ("flags"); a sweep's has its command line
    (env.command, a case's own flags included)."""
    if "flags" in doc:
        return list(doc["flags"])
    try:
        return shlex.split(doc["env"]["command"])
    except (KeyError, TypeError, ValueError):
        raise DynspecError(f"{where}: neither 'flags' nor 'env.command' gives its sweep flags") from None


def setting_of(flags: Sequence[str], where: str, mode: str, schedule: str = "") -> str:
    """A drafting mode's setting from its stage's sweep flags. dynamic: 'prefill-k 0', 'prefill-k 37:1'
    (--prefill-k; @FILE: the cap its row's `schedule` names, '1:3,71:2 prefill-k 37:1', else the file's
    where it is still there, else 'from FILE') or 'uncapped';
    adaptive and per-request: 'weight 64' (--ttft-weight, else the default weight; 'weight 64,
    catch-up unpriced' with --catch-up-price off)."""
    from dynspec.runtime.policy.adaptive import TTFT_WEIGHT

    flags = list(flags)

    def raw(flag: str, what: str) -> str | None:
        """The word after `flag`, None without the flag; a flag with nothing after it is refused."""
        if flag not in flags:
            return None
        i = flags.index(flag) + 1
        if i == len(flags) or flags[i].startswith("--"):
            raise DynspecError(f"{where}: its flags {' '.join(flags)!r} give {flag} without {what}")
        return flags[i]

    def value(flag: str) -> float | None:
        text = raw(flag, "a number")
        try:
            return None if text is None else float(text)
        except ValueError:
            raise DynspecError(f"{where}: its flags {' '.join(flags)!r} give {flag} without a number") from None

    if mode == "dynamic":
        cap = raw("--prefill-k", "a value")
        if cap is None:
            return "uncapped"
        if cap.startswith("@"):
            cap = schedule.partition(" prefill-k ")[2] or _cap_of_file(cap)
        return f"prefill-k {cap}"
    if mode in ("adaptive", "per-request"):
        unpriced = ", catch-up unpriced" if "--catch-up-price" in flags[:-1] and \
            flags[flags.index("--catch-up-price") + 1] == "off" else ""
        w = value("--ttft-weight")
        return f"weight {TTFT_WEIGHT if w is None else w:g}{unpriced}"
    raise DynspecError(f"{where}: mode {mode!r} has no prefill-aware setting (dynamic, adaptive or per-request)")


def ttft_figures(docs: Mapping[str, dict], measured: bool = False) -> dict:
    """{stage: simulate's or sweep's JSON} -> {"values", "table", "plot"} (benchmarks/suite_report.py).
    tok_ratio: the ratio of medians; tok_ratio_trials (measured): trial by trial (figures_common.paired_ratio)."""
    rows = []
    for name, doc in docs.items():
        flags = flags_of(doc, name)
        base = {(_load(r), split_mode(r["mode"])[1]): r for r in doc["rows"] if split_mode(r["mode"])[0] == "baseline"}
        for r in doc["rows"]:
            mode, loop = split_mode(r["mode"])
            b = base.get((_load(r), loop))
            if mode == "baseline" or b is None:
                continue
            setting = setting_of(flags, name, mode, r.get("schedule") or "") + (", serial loop" if loop == SERIAL else "")
            rows.append({"setting": setting, "load": _load(r), "mode": mode,
                         "tok_per_s": r["output_tok_per_s"],
                         "tok_ratio": r["output_tok_per_s"] / b["output_tok_per_s"],
                         "p50_ttft_ms": _ms(r["p50_ttft_s"]), "p99_ttft_ms": _ms(r["p99_ttft_s"]),
                         "p50_ttft_ratio": _ratio(r["p50_ttft_s"], b["p50_ttft_s"]),
                         "p99_ttft_ratio": _ratio(r["p99_ttft_s"], b["p99_ttft_s"]),
                         "baseline_p50_ttft_ms": _ms(b["p50_ttft_s"]), "mean_k": r["mean_k"]})
            if measured:
                rows[-1]["tok_ratio_trials"] = {k: v for k, v in paired_ratio(r, [b]).items() if k != "of_medians"} or None
    rows.sort(key=lambda r: (r["mode"], r["load"], _order(r["setting"])))
    header = ["mode", "load", "setting", "tok/s", "x baseline", "TTFT p50 ms", "p50 x baseline", "TTFT p99 ms",
              "p99 x baseline", "mean K"]
    body = [[r["mode"], r["load"], r["setting"], f"{r['tok_per_s']:.0f}", _show_ratio(r),
             _show(r["p50_ttft_ms"]), _show(r["p50_ttft_ratio"], ".2f"), _show(r["p99_ttft_ms"]),
             _show(r["p99_ttft_ratio"], ".2f"), f"{r['mean_k']:.2f}"] for r in rows]
    series: dict = {}
    for r in rows:
        if r["p50_ttft_ratio"] is not None:
            y = r["p50_ttft_ratio"]
            series.setdefault(f"{r['mode']} {r['load']}", []).append([r["tok_ratio"], y, y, y])
    what = "measured" if measured else "simulated"
    plot = {"title": f"{what}: prefill-aware K's trade-off (points: settings, each over the baseline)",
            "x": "sustained tok/s / baseline", "y": "TTFT p50 / baseline", "series": series}
    notes = (["Measured: tok/s ratios are medians of per-trial ratios [min..max] against the baseline of the same "
              "case; TTFT ratios are of the medians."] if measured else
             ["Simulated (benchmarks/simulate.py): one run per setting on the recorded device's profile and step "
              "prices; the GPU's effect is measured by the serving configs."])
    return {"values": {"rows": rows}, "table": {"header": header, "rows": body, "notes": notes}, "plot": plot}


def _load(r: dict) -> str:
    return f"C={r['concurrency']}" if r.get("concurrency") is not None else f"poisson~C={r['matched_concurrency']}"


def _ms(s: float | None) -> float | None:
    return None if s is None else s * 1e3


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _show_ratio(r: Mapping) -> str:
    t = r.get("tok_ratio_trials")
    return f"{t['median']:.3f} [{t['min']:.3f}..{t['max']:.3f}]" if t else f"{r['tok_ratio']:.3f}"


def _show(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def _cap_of_file(flag: str) -> str:
    """'@FILE' -> the cap's text where FILE still holds one, else 'from FILE' (a run's own folder, gone)."""
    from dynspec.runtime.policy.prefill_cap import cap_text, parse_cap

    try:
        return cap_text(parse_cap(flag))
    except DynspecError:
        return f"from {flag[1:]}"


def _order(setting: str) -> tuple:
    """Table order within a mode and load: the overlapped loop first; weights ascending (each
    unpriced first); uncapped, then caps descending."""
    serial = setting.endswith(", serial loop")
    label, _, v = setting.removesuffix(", serial loop").partition(" ")
    unpriced = v.endswith(", catch-up unpriced")
    v = v.removesuffix(", catch-up unpriced")
    if label == "weight":
        return serial, 0, float(v), not unpriced
    if label == "uncapped":
        return serial, 1, 0.0, 0
    return serial, 2, -_cap_k(v), v.count(":")      # caps by their largest K; one K before tiers


def _cap_k(text: str) -> float:
    """A cap's largest K ('1' -> 1, '37:1' -> 1; 'tuned': between K=1 and 0)."""
    from dynspec.runtime.policy.prefill_cap import parse_cap

    try:
        return float(parse_cap(text).max_draft_len)
    except DynspecError:
        return 0.5
