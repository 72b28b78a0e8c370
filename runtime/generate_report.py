"""`dynspec generate`'s report: replicas' results interleaved back into prompt order, per-mode
figures (tok/s per trial, K per batch size, accepted drafts) and the JSONL outputs."""
from __future__ import annotations

import json


def interleave(shares: list[list], n: int) -> list:
    """Replica r served prompts r, r+R, r+2R, ...: [[a0, a2], [a1]] (R=2, n=3) -> [a0, a1, a2]."""
    out: list = [None] * n
    for r, share in enumerate(shares):
        out[r::len(shares)] = share
    return out


def summarize(stats, results) -> dict:
    """K per batch size as it happened, mean accepted length, tokens per second."""
    k_by_b: dict[int, set] = {}
    for s in stats:
        if s.batch_size:                       # prompt-only iterations (b=0) decide no K
            k_by_b.setdefault(s.batch_size, set()).add(s.k)
    spec = [s for s in stats if s.k > 0]
    tokens = sum(len(r.output_ids) for r in results)
    wall = max(r.finish_s for r in results) - min(r.submit_s for r in results)
    return {
        "k_by_batch_size": {b: sorted(ks) for b, ks in sorted(k_by_b.items())},
        "mean_accepted_len": (sum(s.accepted for s in spec) / sum(s.batch_size for s in spec)) if spec else 0.0,
        "tokens": tokens,
        "tok_per_s": tokens / wall if wall > 0 else float("nan"),
        "iterations": len(stats),
    }


def format_report(report: dict) -> str:
    """Per mode: tok/s (the median trial's, with the range over trials), tokens, iterations, mean
    accepted drafts per step and the K each batch size got; with baseline, static and dynamic, the
    median over trials of dynamic / max(baseline, static), trial by trial."""
    from statistics import median

    lines = []
    for mode, r in report.items():
        tps = r.get("trials_tok_per_s") or [r["tok_per_s"]]
        spread = f" [{min(tps):.1f}..{max(tps):.1f}, {len(tps)} trials]" if len(tps) > 1 else ""
        ks = ", ".join(f"b={b}:K={'/'.join(map(str, k))}" for b, k in r["k_by_batch_size"].items())
        lines.append(f"{mode:>8}: {median(tps):8.1f} tok/s{spread}  {r['tokens']} tokens in {r['iterations']} "
                     f"iterations  mean accepted drafts/step {r['mean_accepted_len']:.2f}")
        lines.append(f"{'':>10}K per batch size: {ks}")
    if {"baseline", "static", "dynamic"} <= set(report):
        per = [d / max(b, s) for b, s, d in zip(*(report[m].get("trials_tok_per_s") or [report[m]["tok_per_s"]]
                                                  for m in ("baseline", "static", "dynamic")))]
        lines.append(f"dynamic / max(baseline, static): {median(per):.3f} (median of per-trial ratios "
                     f"{', '.join(f'{x:.3f}' for x in per)})")
    return "\n".join(lines)


def write_jsonl(path, rows) -> None:
    from dynspec.artifacts import write_text

    write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
