"""The sweep's modes and the draft policy each one runs.

    baseline   K = 0 always                 static     one K (--static-k) for every batch size
    static:K   that K for every batch size  dynamic    the engine's (or a tuned) schedule
    adaptive   the cost model's policy (runtime/policy/adaptive.py)
    per-request  each row's own K from its acceptance and the cost model (runtime/policy/per_request.py)
    per-request-oracle  per-request's rules on each request's true rate (runtime/policy/per_request_oracle.py;
                 benchmarks only: the ceiling of any learned per-request policy)
A mode runs through the executor's serving loop (runtime/serving/loop.py serving_loop: overlapped on CUDA,
serial on CPU, or as engine.json reference.overlap pins it), unless it names one with a suffix:
    'dynamic+serial'    the serial loop          'dynamic+overlap'   the overlapped loop
So on CUDA 'baseline+serial,baseline' runs the target alone through both loops.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from dynspec.errors import DynspecError
from dynspec.runtime.serving.loop import Loop
from dynspec.runtime.policy import POLICIES, DraftSchedule, registered_name
from dynspec.runtime.policy.schedule_args import spec_file


MODES = ("baseline", "static", "dynamic")            # the default --modes; TensorRT-LLM runs these alone
COST_MODES = tuple(n for n, p in POLICIES.items() if p.cost_model)   # the modes that read a cost model
ALL_MODES = MODES + COST_MODES                        # and static:K, K in 1..MAX_STATIC_K
TRTLLM_MODES = MODES
SERIAL = "+serial"            # a mode's loop suffixes: 'dynamic+serial' runs Executor(loop=Loop.SERIAL),
OVERLAP = "+overlap"          # 'dynamic+overlap' Executor(loop=Loop.OVERLAPPED); no suffix: the serving loop
LOOP_SUFFIXES = {SERIAL: Loop.SERIAL, OVERLAP: Loop.OVERLAPPED}
LOOP_LABELS = {Loop.SERIAL: "serial", Loop.OVERLAPPED: "overlap"}    # a row's `loop`
MAX_STATIC_K = 32


def parse_modes(text: str) -> tuple[str, ...]:
    """'baseline,static:1,static:3,dynamic,adaptive' -> those five modes; each static:K is a mode of
    its own (K in 1..32), plain 'static' takes --static-k. Any of them may name its executor loop
    with a suffix, '+serial' or '+overlap' ('baseline+serial,baseline+overlap'); without one it
    runs the serving loop (mode_loop)."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if base_mode(m) not in ALL_MODES and static_k_of(base_mode(m)) is None]
    if bad or not modes:
        raise DynspecError(f"--modes {text!r}: unknown mode(s) {bad}; choose from {','.join(ALL_MODES)} or static:K"
                           f" (K in 1..{MAX_STATIC_K}), each optionally with {SERIAL} or {OVERLAP}")
    if len(set(modes)) != len(modes):
        raise DynspecError(f"--modes {text!r} repeats a mode")
    return modes


def split_mode(mode: str) -> tuple[str, str]:
    """(policy part, loop suffix): 'static:3+overlap' -> ('static:3', '+overlap');
    'dynamic+serial' -> ('dynamic', '+serial'); 'dynamic' -> ('dynamic', '')."""
    for suffix in LOOP_SUFFIXES:
        if mode.endswith(suffix):
            return mode[: -len(suffix)], suffix
    return mode, ""


def base_mode(mode: str) -> str:
    """The policy part of a mode: 'static:3+overlap' -> 'static:3'; 'dynamic' -> 'dynamic'."""
    return split_mode(mode)[0]


def mode_loop(mode: str, default: Loop) -> Loop:
    """The executor loop a mode runs: its suffix's, else `default` (the serving loop of the
    sweep's device, ReferenceSettings.loop): 'baseline' -> default (OVERLAPPED on CUDA, SERIAL on
    CPU); 'baseline+serial' -> SERIAL; 'baseline+overlap' -> OVERLAPPED."""
    return LOOP_SUFFIXES.get(split_mode(mode)[1], default)


def mode_loops(modes: Sequence[str], default: Loop) -> dict[str, Loop]:
    """{mode: its loop} (mode_loop), refusing two modes that run one policy through one loop:
    ('baseline', 'baseline+overlap') with default OVERLAPPED -> "... both run baseline through the
    overlapped loop ..."."""
    loops = {m: mode_loop(m, default) for m in modes}
    seen: dict[tuple[str, Loop], str] = {}
    for m, loop in loops.items():
        other = seen.setdefault((base_mode(m), loop), m)
        if other != m:
            raise DynspecError(f"--modes: {other} and {m} both run {base_mode(m)} through the {loop.value} loop"
                               f" (a mode without a suffix runs the serving loop, {default.value} here); name the"
                               f" loops with {SERIAL} and {OVERLAP}")
    return loops


def static_k_of(mode: str) -> int | None:
    """'static:3' -> 3; anything else (plain 'static' too) -> None."""
    head, sep, k = mode.partition(":")
    if head != "static" or not sep or not k.isdigit() or not 1 <= int(k) <= MAX_STATIC_K:
        return None
    return int(k)


def read_schedule_arg(text: str, where: str = "--dynamic-schedule") -> DraftSchedule:
    """'4:4,8:2' or '@schedule.txt' (the file `dynspec tune --out` writes; schedule_args.spec_file)."""
    return DraftSchedule.parse(spec_file(text, where, "tiers") if text.startswith("@") else text)


def mode_schedules(modes: Sequence[str], dynamic: DraftSchedule, static_k: int | None,
                   max_batch_size: int) -> dict[str, DraftSchedule]:
    """baseline: K=0 always; static: K for every batch size; static:K that K; dynamic: the engine's
    (or a tuned) schedule; a mode with a loop suffix ('static:3+overlap') its base mode's.
    Adaptive and per-request are not schedules (cost_policy).

    static_k defaults to the dynamic schedule's max_draft_len: 'what if we never switched'."""
    out = {}
    for mode in modes:
        m = base_mode(mode)
        if m == "baseline":
            out[mode] = DraftSchedule()
        elif m == "static":
            k = dynamic.max_draft_len if static_k is None else static_k
            if k < 1:
                raise DynspecError("static mode needs --static-k K >= 1 (the dynamic schedule never speculates)")
            out[mode] = DraftSchedule.static(k, max_batch_size)
        elif static_k_of(m) is not None:
            out[mode] = DraftSchedule.static(static_k_of(m), max_batch_size)
        elif m == "dynamic":
            out[mode] = dynamic
    return out


def cost_model_path(args: argparse.Namespace) -> Path:
    """--cost-model, else ENGINE_DIR/cost_model.json; the adaptive and per-request modes' one source."""
    if args.cost_model:
        p = Path(args.cost_model)
    elif getattr(args, "engine_dir", None):
        p = Path(args.engine_dir) / "cost_model.json"
    else:
        raise DynspecError("adaptive and per-request modes need a cost model: give --cost-model FILE (no --engine-dir to find"
                           " cost_model.json in)")
    if not p.is_file():
        raise DynspecError(f"adaptive and per-request modes need a cost model and {p} does not exist: write it with"
                           f" `dynspec profile ... --out {p}` or give --cost-model FILE")
    return p


def adaptive_policy(path: Path, max_draft_len: int | None):
    """The adaptive mode's policy (runtime/policy/adaptive.py): the cost model at `path`, K at most
    max_draft_len (None: every K the cost model profiled)."""
    from dynspec.runtime.policy.adaptive import load_policy

    return load_policy(path, max_draft_len)


def cost_policy(mode: str, path: Path, max_draft_len: int | None, prices=None, ttft_weight: float | None = None):
    """The policy of a cost-model mode (COST_MODES: 'adaptive', 'per-request', 'per-request-oracle'),
    K at most max_draft_len, priced with `prices` (the device's StepPrices, None: none;
    runtime/policy/__init__.py PolicyKind.make); every one weighs a prompt its step ends at
    ttft_weight (None: the default, runtime/policy/prefill_price.py)."""
    from dynspec.runtime.policy.cost_model import CostModel

    return POLICIES[base_mode(mode)].make(CostModel.load(path), max_draft_len, prices=prices, ttft_weight=ttft_weight)


def policy_prices(args: argparse.Namespace, cost_model: Path):
    """The StepPrices the cost-model modes run with: --step-prices' of the running device (a folder
    without that device's file: none, said in one line), else step_prices.json beside the cost model
    (runtime/policy/step_prices.py); None: none."""
    from dynspec.runtime.policy.step_prices import for_device, prices_beside

    if not getattr(args, "step_prices", None):
        return prices_beside(cost_model)
    dev = "cpu"
    if str(args.device).startswith("cuda"):
        import torch

        dev = torch.cuda.get_device_name(torch.device(args.device).index or 0)
    prices = for_device(args.step_prices, dev)
    if prices is None:
        print(f"--step-prices {args.step_prices}: no prices of {dev!r}; per-row vectors at their split price,"
              f" prompt chunks unpriced", flush=True)
    return prices


def mode_policies(modes: Sequence[str], dynamic: DraftSchedule, static_k: int | None, max_batch_size: int,
                  cost_model: Path | None, prices=None, ttft_weight: float | None = None,
                  prefill_k: object = None) -> tuple[dict, int]:
    """({mode: the policy it runs}, the largest K any of them picks: the engine's max_draft_len):
    the schedules of mode_schedules (dynamic's K capped by prefill_k, any form prefill_cap.parse_cap
    reads, on iterations that end a prompt's prefill: runtime/policy/prefill_cap.py; None: no cap), and each cost-model mode's policy
    on `cost_model` with K up to that max (cost_policy; prices as there). cost_model None: no
    cost-model mode may be asked."""
    schedules: dict = mode_schedules(modes, dynamic, static_k, max_batch_size)
    from dynspec.runtime.policy.prefill_cap import capped

    for m in modes:
        if base_mode(m) == "dynamic":
            schedules[m] = capped(schedules[m], prefill_k)
    kmax = max([s.max_draft_len for s in schedules.values()] + [1])
    if any(base_mode(m) in COST_MODES for m in modes):
        kmax = max([kmax, *adaptive_policy(cost_model, None).candidates])
        for m in modes:
            if base_mode(m) in COST_MODES:
                schedules[m] = cost_policy(m, cost_model, kmax, prices, ttft_weight)
    return {m: schedules[m] for m in modes}, kmax


def price_catch_ups(policies: dict, on: str) -> dict:
    """`policies` with every cost-model policy's catch-up price set by --catch-up-price ('on' | 'off')."""
    for p in policies.values():
        if hasattr(p, "settings"):
            p.settings = replace(p.settings, price_catch_up=on == "on")
    return policies


def policy_label(policy) -> str:
    """A schedule's CLI form ('24:3,179:1'; capped: '24:3,179:1 prefill-k 0'); the registered name of a cost-model policy ('adaptive',
    'per-request' or 'per-request-oracle': runtime/policy/__init__.py POLICIES)."""
    from dynspec.runtime.policy.prefill_cap import PrefillCap

    if isinstance(policy, PrefillCap):
        return policy.to_spec()
    name = registered_name(policy)
    return policy.to_spec() if name == "schedule" else name


def shift_of(model) -> dict | None:
    """{"key": K, "before": p0, "after": p1} of a shift resolved at a key; None for other models."""
    if all(hasattr(model, f) for f in ("before", "after", "at")) and isinstance(model.at, int):
        return {"key": model.at, "before": model.before, "after": model.after}
    return None
