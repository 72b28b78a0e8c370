"""`dynspec generate`'s report: replicas' results interleaved back into prompt order, per load and
mode the figures (tok/s, tokens a step, accepted drafts, the K each batch size got), whether every
mode wrote the same text, the verdict line and the JSONL outputs.

The tok/s figure ("fastest"): the serial loop runs the same iterations in every trial of a mode
(greedy output, admissions in a fixed order), so each iteration is timed once per trial; the figure
takes every iteration at its fastest trial: tokens / sum over iterations of min over trials of the
iteration's time (the previous iteration's end to its own). Other processes on a shared machine
only ever add time to an iteration, so its fastest trial is the closest to its own cost, and an
iteration slowed in one trial does not slow the figure. Where the trials ran different iterations
(a policy that reads measured step times), the figure is the median trial's wall tok/s instead."""
from __future__ import annotations

import json
from statistics import median

TIE = 0.10          # static pays at a load where static / baseline >= 1 + TIE (two runs of one configuration differ up to ~8%)


def interleave(shares: list[list], n: int) -> list:
    """Replica r served prompts r, r+R, r+2R, ...: [[a0, a2], [a1]] (R=2, n=3) -> [a0, a1, a2]."""
    out: list = [None] * n
    for r, share in enumerate(shares):
        out[r::len(shares)] = share
    return out


def summarize(stats, results) -> dict:
    """K per batch size as it happened, mean accepted length, tokens per second (wall)."""
    k_by_b: dict[int, set] = {}
    for s in stats:
        if s.batch_size:                       # prompt-only iterations (b=0) decide no K
            k_by_b.setdefault(s.batch_size, set()).add(s.k)
    spec = [s for s in stats if s.k > 0]
    decode = [s for s in stats if s.batch_size]
    tokens = sum(len(r.output_ids) for r in results)
    wall = max(r.finish_s for r in results) - min(r.submit_s for r in results)
    return {
        "k_by_batch_size": {b: sorted(ks) for b, ks in sorted(k_by_b.items())},
        "mean_accepted_len": (sum(s.accepted for s in spec) / sum(s.batch_size for s in spec)) if spec else 0.0,
        "tokens_per_step": (sum(s.emitted for s in decode) / sum(s.batch_size for s in decode)) if decode else 0.0,
        "mixed": sum(1 for s in decode if s.prefill_tokens) / len(decode) if decode else 0.0,
        "tokens": tokens,
        "tok_per_s": tokens / wall if wall > 0 else float("nan"),
        "iterations": len(stats),
    }


def iteration_seconds(stats, start_s: float) -> list[float]:
    """Each iteration's time: from the previous iteration's end (the first: the trial's start) to its own."""
    ends = [start_s] + [s.end_s for s in stats]
    return [b - a for a, b in zip(ends, ends[1:])]


def signature(stats) -> list[tuple]:
    """What an iteration ran: (b, K, prompt tokens, accepted, emitted) each."""
    return [(s.batch_size, s.k, s.prefill_tokens, s.accepted, s.emitted) for s in stats]


def fastest_seconds(trials: list[tuple]) -> float | None:
    """One replica's trials [(stats, start_s)]: sum over iterations of the iteration's fastest time
    over the trials; None when the trials did not run the same iterations."""
    sigs = [signature(st) for st, _ in trials]
    if any(s != sigs[0] for s in sigs[1:]):
        return None
    times = [iteration_seconds(st, t0) for st, t0 in trials]
    return sum(min(col) for col in zip(*times))


def mode_figures(per_replica: list[list[tuple]]) -> dict:
    """One load and mode: per_replica[r][t] = (results, stats, start_s) -> the summary of the last
    trial plus 'fastest' (tok/s, None where trials differ) and 'trials_tok_per_s' (wall, every trial)."""
    n_trials = len(per_replica[0])
    merged = [(sum((rep[t][1] for rep in per_replica), []), sum((rep[t][0] for rep in per_replica), []))
              for t in range(n_trials)]
    out = summarize(*merged[-1])
    out["trials_tok_per_s"] = [summarize(st, res)["tok_per_s"] for st, res in merged]
    secs = [fastest_seconds([(st, t0) for _, st, t0 in rep]) for rep in per_replica]
    out["fastest"] = None if None in secs or max(secs) <= 0 else out["tokens"] / max(secs)
    out["ms_per_step"] = None if out["fastest"] is None else 1e3 * sum(secs) / max(out["iterations"], 1)
    return out


def figure(r: dict) -> float:
    """The figure a mode is compared by: 'fastest', else the median trial's wall tok/s."""
    return r["fastest"] if r.get("fastest") is not None else median(r["trials_tok_per_s"])


def k_ranges(k_by_b: dict) -> str:
    """{1: [4], 2: [4], 3: [2]} -> 'b=1-2:K=4, b=3:K=2' (runs of batch sizes with the same K's)."""
    runs: list[list] = []
    for b, ks in k_by_b.items():
        if runs and runs[-1][2] == ks and runs[-1][1] == b - 1:
            runs[-1][1] = b
        else:
            runs.append([b, b, ks])
    return ", ".join(f"b={lo}{'' if lo == hi else f'-{hi}'}:K={'/'.join(map(str, ks))}" for lo, hi, ks in runs)


def format_load(c: int, n_prompts: int, new_tokens: int, report: dict) -> list[str]:
    """One load's block: a title line, then per mode its figure, the wall trials, tokens a step,
    accepted drafts, mixed iterations and the K each batch size got."""
    trials = len(next(iter(report.values()))["trials_tok_per_s"])
    lines = [f"C={c}: {n_prompts} prompts x {new_tokens} new tokens, {trials} interleaved trials"]
    for mode, r in report.items():
        tps = r["trials_tok_per_s"]
        mark = "" if r.get("fastest") is not None else " (median trial: trials differ)"
        step = f" in {r['ms_per_step']:.1f} ms" if r.get("ms_per_step") is not None else ""
        lines.append(f"  {mode:>8}: {figure(r):7.1f} tok/s{mark}  wall {median(tps):7.1f} [{min(tps):.1f}..{max(tps):.1f}]"
                     f"  {r['tokens_per_step']:.2f} tokens/step{step}, accepted {r['mean_accepted_len']:.2f}, "
                     f"mixed {r['mixed']:.0%}  {k_ranges(r['k_by_batch_size'])}")
    return lines


def ratios(report: dict) -> tuple[float, float] | None:
    """(static / baseline, dynamic / max(baseline, static)) by the figure, or None without the three modes."""
    if not {"baseline", "static", "dynamic"} <= set(report):
        return None
    b, s, d = (figure(report[m]) for m in ("baseline", "static", "dynamic"))
    return s / b, d / max(b, s)


def verdict(loads: dict, dynamic_k: dict, static_k: int) -> str | None:
    """loads {C: report}, dynamic_k {C: the dynamic schedule's K at b=C} -> the verdict line, in words
    only: at each load whether static (K=static_k) pays (beats baseline by TIE or more) and whether
    dynamic speculates at that batch size; K follows the mission at a load where the two agree."""
    parts, held = [], 0
    for c, report in loads.items():
        r = ratios(report)
        if r is None:
            return None
        pays, on = r[0] >= 1 + TIE, dynamic_k[c] > 0
        held += pays == on
        does = "dynamic speculates" if on else "dynamic turns K off"
        parts.append(f"C={c} static K={static_k} {'pays' if pays else 'does not pay'} {'and' if pays == on else 'but'} "
                     f"{does}")
    return f"verdict: {'; '.join(parts)}: K follows the mission at {held} of {len(loads)} loads"


def text_line(outputs: dict) -> str:
    """outputs {(C, mode, trial): [output ids per prompt]} -> one line: identical everywhere, or where not."""
    keys = list(outputs)
    n = max(len(v) for v in outputs.values())
    differ = [i for i in range(n) if len({tuple(outputs[k][i]) for k in keys if i < len(outputs[k])}) > 1]
    runs = f"{len({k[1] for k in keys})} modes x {len({k[0] for k in keys})} loads x {len({k[2] for k in keys})} trials"
    if not differ:
        return f"text: identical in every mode, load and trial ({n} prompts; {runs})"
    return f"text: NOT identical: {len(differ)} of {n} prompts differ (first: prompt {differ[0]}; {runs})"


def render(blocks: list[tuple[int, int, int, dict]], dynamic_k: dict, outputs: dict, static_k: int) -> str:
    """Everything after the header: blocks [(C, prompts, new tokens, {mode: figures})] each with its
    ratio line, what the figures are, the text line and, with baseline, static and dynamic, the verdict."""
    lines = []
    for c, n, new, report in blocks:
        lines += format_load(c, n, new, report)
        r = ratios(report)
        if r is not None:
            lines.append(f"  static / baseline {r[0]:.3f}; dynamic / max(baseline, static) {r[1]:.3f}")
    trials = len(blocks[0][3][next(iter(blocks[0][3]))]["trials_tok_per_s"])
    lines.append(f"tok/s: each iteration at its fastest of the {trials} trials; wall: the median trial's "
                 f"[slowest..fastest]; tokens/step: a row's, in the step's ms; mixed: steps with prompt chunks")
    lines.append(text_line(outputs))
    v = verdict({c: rep for c, _, _, rep in blocks}, dynamic_k, static_k)
    if v is not None:
        lines.append(v)
    return "\n".join(lines)


def write_jsonl(path, rows) -> None:
    from dynspec.artifacts import write_text

    write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
