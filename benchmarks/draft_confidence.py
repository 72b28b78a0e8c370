"""Does the draft's top-1 probability sharpen per-request acceptance estimates enough to pay?

    python -m dynspec.benchmarks.draft_confidence --prompts 32 --new 96 --k 4 --out FILE.json

decode.spec_decode (greedy, K-chain every step) decodes held-out prompts, keeping per step the accepted a
and per drafted position j the draft's top-1 probability p_j (tried: a >= j - 1, accepted: a >= j). Walking
requests in order (online), predictors of P(accept at j | tried): a_pool (running pooled rate), b_shrunk
((h_j + w pool_j) / (t_j + w)), c_platt / c_iso (logistic on logit p_j / isotonic map of p_j), d_logistic
([1, logit b_j, logit p_j]), e_p1_logistic ([1, logit b_j, logit p_1]). Only p_1 exists before K is fixed (the
previous step's cache-extension pass makes it), so c and d are hindsight bounds; e is what an engine can use.
Scored by Brier and log loss on tried positions and tokens/step of K policies: open loop on the recorded steps
(tau: K = #{k: prod a_l >= tau}; budget D: top D*steps gains); closed loop, exact: with chains from every output
offset (as record_trace.py) each request is re-decoded with the K its predictor picks online from the trials
its K made; every --probe-th step drafts the full K (else a rate under tau is never retried).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from dynspec.benchmarks.record_trace import one_thread
from dynspec.pairs.decode import check_prompts, greedy_continue, spec_decode
from dynspec.runtime.engines.reference.load import load_draft, load_target

PREDICTORS = ("a_pool", "b_shrunk", "c_platt", "c_iso", "d_logistic", "e_p1_logistic")
TAUS, BUDGETS = (0.3, 0.5, 0.7, 0.9), (1.0, 2.0, 3.0)
EPS, BINS = 1e-4, 20


def logit(x):
    return np.log(x := np.clip(np.asarray(x, dtype=np.float64), EPS, 1 - EPS)) - np.log1p(-x)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-np.clip(np.asarray(z, dtype=np.float64), -30, 30)))


class _Probs:
    """The draft for spec_decode, keeping each call's last top-1 probability (prefill / extension: next j=1)."""

    def __init__(self, draft):
        self.draft, self.p = draft, []

    def __getattr__(self, name):
        return getattr(self.draft, name)

    def __call__(self, *args, **kw):
        logits, hidden = self.draft(*args, **kw)
        self.p.append(float(logits[0, -1].float().softmax(-1).max()))
        return logits, hidden


def record_request(target, draft, prompt: list[int], new: int, k: int):
    """decode.spec_decode itself -> (tokens [new], accepted [steps], top-1 probs [steps][k])."""
    spy = _Probs(draft)
    out, accepted = spec_decode(target, spy, prompt, new, k)
    return out, accepted, [spy.p[i * k:(i + 1) * k] for i in range(len(accepted))]


def chain_table(target, draft, prompt: list[int], new: int, k: int):
    """record_trace.chain_runs plus probabilities: r [new] (chain at offset t accepts r_t), P [new, k] top-1."""
    with torch.no_grad():
        n, seq = len(prompt), greedy_continue(target, torch.tensor([prompt]), new + k)[0]
        T, L = seq.numel(), n + new - 1
        target.setup_cache(1, T)
        _, hid = target(seq[None], torch.arange(T)[None], capture=draft.capture_layers)
        draft.setup_cache(new, T + 1)
        dl, dh = draft(seq[1:L + 1].expand(new, L), hid[:, :L].expand(new, L, -1), torch.arange(L).expand(new, L))
        q, rows = n + torch.arange(new), torch.arange(new)
        logit_, h = dl[rows, q - 1], dh[rows, q - 1][:, None]
        drafts, ps = [], []
        for s in range(k):
            ps.append(logit_.float().softmax(-1).amax(-1))
            drafts.append(d := draft.to_target_ids(logit_.argmax(-1)))
            if s < k - 1:
                dl1, h = draft(d[:, None], h, (q + s)[:, None])
                logit_ = dl1[:, -1]
        truth = seq[q[:, None] + 1 + torch.arange(k)]
        r = (torch.stack(drafts, 1) == truth).long().cumprod(1).sum(1)
    return r.numpy(), torch.stack(ps, 1).double().numpy()


def fit_logistic(X, y, prior, start=None, l2: float = 1.0, iters: int = 25):
    """argmin NLL + l2/2 |w - prior|^2 by damped Newton, from `start` (default: the prior)."""
    prior = np.asarray(prior, dtype=np.float64)
    w = np.array(prior if start is None else start, dtype=np.float64)
    obj = lambda v: np.logaddexp(0, X @ v).sum() - y @ (X @ v) + l2 / 2 * ((v - prior) ** 2).sum()  # noqa: E731
    for _ in range(iters):
        q = sigmoid(X @ w)
        H = (X * (q * (1 - q))[:, None]).T @ X + l2 * np.eye(len(w))
        step, f0 = np.linalg.solve(H, X.T @ (q - y) + l2 * (w - prior)), obj(w)
        while obj(w - step) > f0 and np.abs(step).max() > 1e-9:
            step /= 2
        w = w - step
        if np.abs(step).max() < 1e-7:
            break
    return w


def pav(values, weights) -> np.ndarray:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent violators."""
    vals, wts, sizes = [], [], []
    for v, wt in zip(values, weights):
        vals.append(float(v)), wts.append(float(wt)), sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2, s2 = vals.pop(), wts.pop(), sizes.pop()
            vals[-1] = (vals[-1] * wts[-1] + v2 * w2) / (wts[-1] + w2)
            wts[-1], sizes[-1] = wts[-1] + w2, sizes[-1] + s2
    return np.repeat(vals, sizes)


class Online:
    """Every predictor's state; predict() uses only what observe() was given before."""

    def __init__(self, k: int, w: float = 8.0, refit: int = 8, min_n: int = 20):
        self.k, self.w, self.refit, self.min_n = k, w, refit, min_n
        self.H, self.T, self.h, self.t = (np.zeros(k) for _ in range(4))   # hits, trials: pool; this request
        self.rows: list[tuple] = []                                 # (j, b_j, p_j, p_1, y) per trial
        self.models, self.since = {}, 0

    def new_request(self) -> None:
        self.h, self.t = np.zeros(self.k), np.zeros(self.k)

    def _fit(self) -> None:
        data = np.array(self.rows, dtype=np.float64).reshape(-1, 5)
        pool = (self.H + 1) / (self.T + 2)
        for j in range(self.k):
            d = data[data[:, 0] == j]
            if len(d) < self.min_n:
                continue
            y, one, lb, lp, lp1 = d[:, 4], np.ones(len(d)), logit(d[:, 1]), logit(d[:, 2]), logit(d[:, 3])
            b_idx = np.minimum((d[:, 2] * BINS).astype(int), BINS - 1)
            n, hits = np.bincount(b_idx, minlength=BINS), np.bincount(b_idx, weights=y, minlength=BINS)
            prev, feats = self.models.get(j, {}), {"c": (lp,), "d": (lb, lp), "e": (lb, lp1)}
            prior = {"c": [float(logit(pool[j])), 0.0], "d": [0.0, 1.0, 0.0], "e": [0.0, 1.0, 0.0]}   # c: pool, d/e: b
            self.models[j] = {m: fit_logistic(np.stack([one, *f], 1), y, prior[m], prev.get(m)) for m, f in feats.items()}
            self.models[j]["iso"] = pav((hits + 2 * pool[j]) / (n + 2), n + 2)
        self.since = 0

    def predict(self, p) -> dict[str, np.ndarray]:
        """p [k]: this chain's top-1 draft probabilities -> {predictor: [k] P(accept at j | tried)}."""
        self._fit() if self.since >= self.refit else None
        p = np.asarray(p, dtype=np.float64)
        pool = (self.H + 1) / (self.T + 2)
        b = (self.h + self.w * pool) / (self.t + self.w)
        out = {"a_pool": pool, "b_shrunk": b, "c_platt": pool.copy(), "c_iso": pool.copy(),
               "d_logistic": b.copy(), "e_p1_logistic": b.copy()}
        lb, lp, lp1 = logit(b), logit(p), logit(p[0])
        for j, m in self.models.items():
            out["c_platt"][j] = sigmoid(m["c"] @ [1.0, lp[j]])
            out["c_iso"][j] = m["iso"][min(int(p[j] * BINS), BINS - 1)]
            out["d_logistic"][j] = sigmoid(m["d"] @ [1.0, lb[j], lp[j]])
            out["e_p1_logistic"][j] = sigmoid(m["e"] @ [1.0, lb[j], lp1])
        return out

    def observe(self, b, p, K: int, a: int) -> None:
        """A step drafted K, accepted a: positions 1..min(a + 1, K) tried, 1..a hit."""
        y = (np.arange(n := min(a + 1, K)) < a).astype(float)
        self.rows += [(j, b[j], p[j], p[0], y[j]) for j in range(n)]
        for arr, v in ((self.H, y), (self.h, y), (self.T, 1.0), (self.t, 1.0)):
            arr[:n] += v
        self.since += 1


def open_loop(records, k: int, w: float, refit: int):
    """Per request (accepted, probs) of the K-trajectory -> (req [N], acc [N], {predictor: online [N, k]})."""
    on = Online(k, w, refit)
    req, acc, preds = [], [], {n: [] for n in PREDICTORS}
    for i, (accepted, probs) in enumerate(records):
        on.new_request()
        for a, p in zip(accepted, probs):
            pr = on.predict(p)
            [preds[n].append(pr[n]) for n in PREDICTORS]
            on.observe(pr["b_shrunk"], p, k, a)
            req.append(i), acc.append(a)
    return np.array(req), np.array(acc), {n: np.array(v).reshape(-1, k) for n, v in preds.items()}


def losses(pred, acc, k: int):
    """(tried [N, k], Brier [N, k], log loss [N, k]) of the predictions on the recorded outcomes."""
    tried, y, q = acc[:, None] >= np.arange(k), (acc[:, None] > np.arange(k)).astype(float), np.clip(pred, EPS, 1 - EPS)
    return tried, (q - y) ** 2, -(y * np.log(q) + (1 - y) * np.log1p(-q))


def scores(pred, acc, k: int) -> dict:
    """Brier and log loss over tried positions, overall and per position 1..k."""
    tried, brier, ll = losses(pred, acc, k)
    out = {"n": int(tried.sum()), "brier": float(brier[tried].mean()), "log_loss": float(ll[tried].mean())}
    out["per_position"] = [{"j": c + 1, "n": int(t.sum()), "rate": float((acc[t] > c).mean()),
                            "brier": float(brier[t, c].mean()), "log_loss": float(ll[t, c].mean())}
                           for c, t in enumerate(tried.T) if t.any()]
    return out


def tokens(acc, K) -> dict:
    got = np.minimum(np.asarray(acc), np.asarray(K))
    return {"tokens_per_step": float((got + 1).mean()), "drafted_per_step": float(np.mean(K)),
            "accepted_per_drafted": float(got.sum() / max(np.sum(K), 1))}


def policies(pred) -> dict[str, np.ndarray]:
    """Open-loop K per step: tau_T (K = #{k: prod_{l<=k} a_l >= T}), budget_D (top D*steps gains)."""
    gain = np.cumprod(pred, axis=1)
    out = {f"tau_{t}": (gain >= t).sum(1) for t in TAUS}
    order = np.argsort(-gain.ravel(), kind="stable")
    for D in BUDGETS:
        chosen = np.zeros(gain.size, bool)
        chosen[order[:int(round(D * len(pred)))]] = True
        out[f"budget_{D}"] = chosen.reshape(gain.shape).sum(1)
    return out


def closed_loop(tables, new: int, k: int, w: float, refit: int, name, tau: float = 0.0, probe: int = 8):
    """Decode every request from its chain table with K chosen online by predictor `name` at
    `tau` (an int: K fixed; "oracle": K = r_t); the predictor sees only the trials of its own K."""
    on, acc_all, K_all = Online(k, w, refit), [], []
    for r, P in tables:
        on.new_request()
        out = s = 0
        while out + 1 < new:
            a_full, p = int(r[out]), P[out]
            pr = on.predict(p) if isinstance(name, str) and name != "oracle" else None
            K = (name if pr is None and name != "oracle" else a_full if pr is None
                 else k if s % probe == 0 else int((np.cumprod(pr[name]) >= tau).sum()))
            a = min(a_full, K)
            pr is None or on.observe(pr["b_shrunk"], p, K, a)
            acc_all.append(a_full), K_all.append(K)
            out, s = out + a + 1, s + 1
    return tokens(acc_all, K_all) | {"steps": len(K_all)}


def bootstrap(per_req: dict[str, np.ndarray], base: str, n: int = 2000, seed: int = 0) -> dict:
    """95% interval of (predictor - base) ratio of sums, resampling requests; per_req [R, 2]."""
    idx = np.random.default_rng(seed).integers(0, R := len(per_req[base]), (n, R))
    b = per_req[base][idx].sum(1)
    return {name: [round(float(x), 4) for x in np.percentile(
        v[idx].sum(1)[:, 0] / v[idx].sum(1)[:, 1] - b[:, 0] / b[:, 1], [2.5, 97.5])] for name, v in per_req.items()}


def evaluate(records, tables, new: int, k: int, w: float = 8.0, refit: int = 8, probe: int = 8) -> dict:
    """records: per request (accepted, probs) as spec_decode ran it; tables: per request chain_table."""
    req, acc, preds = open_loop(records, k, w, refit)
    ol, ll_req, tok_req = {}, {}, {}
    for n in PREDICTORS:
        Ks = policies(preds[n])
        ol[n] = scores(preds[n], acc, k) | {"allocation": {pol: tokens(acc, K) for pol, K in Ks.items()}}
        tried, _, ll = losses(preds[n], acc, k)
        ll_req[n] = np.stack([np.bincount(req, (ll * tried).sum(1)), np.bincount(req, tried.sum(1))], 1)
        tok_req[n] = np.stack([np.bincount(req, np.minimum(acc, Ks["budget_2.0"]) + 1), np.bincount(req)], 1)
    ol["oracle"] = {"allocation": tokens(acc, acc)}
    ol["uniform"] = {f"K={K}": tokens(acc, np.full(len(acc), K)) for K in range(k + 1)}
    cl = {n: {f"tau_{t}": closed_loop(tables, new, k, w, refit, n, t, probe) for t in TAUS} for n in PREDICTORS}
    cl["oracle"] = closed_loop(tables, new, k, w, refit, "oracle")
    cl["uniform"] = {f"K={K}": closed_loop(tables, new, k, w, refit, K) for K in range(k + 1)}
    return {"steps": len(acc), "requests": len(records), "open_loop": ol, "closed_loop": cl,
            "bootstrap_95ci_vs_b_shrunk": {"log_loss": bootstrap(ll_req, "b_shrunk"),
                                           "open_budget_2.0_tokens_per_step": bootstrap(tok_req, "b_shrunk")}}


def flat_records(records) -> dict:
    """Every drafted position as columns: request, step, j (1..k), tried, accepted, p."""
    rows = [(i, s, j, int(a >= j - 1), int(a >= j), round(p, 6)) for i, (accepted, probs) in enumerate(records)
            for s, (a, ps) in enumerate(zip(accepted, probs)) for j, p in enumerate(ps, 1)]
    return dict(zip(("request", "step", "j", "tried", "accepted", "p"), map(list, zip(*rows))))


def replay(r, P, new: int, k: int):
    """The K-trajectory a chain table implies: (accepted [S], probs [S][k]) as spec_decode runs it."""
    out, acc, probs = 1, [], []
    while out < new:
        acc.append(min(int(r[out - 1]), k)), probs.append(P[out - 1].tolist())
        out += acc[-1] + 1
    return acc, probs


def measure(folder: Path, prompts: int, new: int, k: int, prompt_len: int, progress: bool = True):
    """(records, tables, cross-check of the two recordings) on the pair in FOLDER."""
    draft = load_draft(folder / "draft", target := load_target(folder / "target"))
    records, tables, bad, dp = [], [], 0, 0.0
    with one_thread():
        for p in tqdm(check_prompts(folder, prompts, prompt_len), desc="decode", unit="prompt",
                      file=sys.stderr, disable=not progress):
            _, acc, probs = record_request(target, draft, p, new, k)
            r, P = chain_table(target, draft, p, new, k)
            racc, rprobs = replay(r, P, new, k)
            bad += racc != acc
            dp = max(dp, float(np.abs(np.array(rprobs) - np.array(probs)).max())) if racc == acc else dp
            records.append((acc, probs)), tables.append((r, P))
    return records, tables, {"requests_where_chain_table_replay_differs": int(bad), "max_abs_p_diff": dp}


def table(res: dict) -> str:
    """Brier, log loss and tokens/step (drafted/step) per predictor; per position: in the JSON."""
    ol, cl, f = res["open_loop"], res["closed_loop"], lambda d: f"{d['tokens_per_step']:.3f} ({d['drafted_per_step']:.2f})"
    pols = [f"open {p}" for p in ol["b_shrunk"]["allocation"]] + [f"closed tau_{t}" for t in TAUS]
    rows = {n: [f"{ol[n]['brier']:.4f}", f"{ol[n]['log_loss']:.4f}"] + [f(d) for d in ol[n]["allocation"].values()]
            + [f(cl[n][f"tau_{t}"]) for t in TAUS] for n in PREDICTORS}
    rows |= {n: ["", "", f(o)] + [""] * (len(pols) - 2) + [f(c)] for n, o, c in [("oracle (K = r)", ol["oracle"]["allocation"],
             cl["oracle"])] + [(f"uniform {K}", d, cl["uniform"][K]) for K, d in ol["uniform"].items()]}
    head = ["predictor", "Brier", "log loss"] + pols
    return "\n".join("| " + " | ".join(r) + " |" for r in [head, ["---"] * len(head)] + [[n] + v for n, v in rows.items()])


def make_parser() -> argparse.ArgumentParser:
    from dynspec.parsers import DefaultsFormatter

    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.draft_confidence", allow_abbrev=False,
                                description=__doc__.splitlines()[0], formatter_class=DefaultsFormatter)
    p.add_argument("--out", required=True, metavar="FILE", help="results JSON (written aside, then renamed)")
    for flag, v, help_ in (("--prompts", 32, "held-out prompts (one request each)"), ("--new", 96, "new tokens per request"),
                           ("--k", 4, "chain length drafted at every verify step"), ("--prompt-len", 48, "tokens per prompt"),
                           ("--refit", 8, "refit the calibration models every N steps"),
                           ("--probe", 8, "closed loop: every Nth step of a request drafts the full K")):
        p.add_argument(flag, type=int, default=v, metavar="N", help=help_)
    p.add_argument("--w", type=float, default=8.0, help="shrinkage pseudo-trials toward the pool")
    p.add_argument("--pair", metavar="DIR", help="pair folder with target/ and draft/ (default: the embedded tiny pair)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    from dynspec.artifacts import write_json
    from dynspec.corpus import ASSET_DIR
    from dynspec.errors import DynspecError

    args = (ap := make_parser()).parse_args(argv)
    for flag, v, lo in (("--prompts", args.prompts, 1), ("--new", args.new, 2), ("--k", args.k, 1), ("--w", args.w, 1e-9),
                        ("--refit", args.refit, 1), ("--probe", args.probe, 1), ("--prompt-len", args.prompt_len, 2)):
        v >= lo or ap.error(f"{flag} {v}: need at least {lo}")
    t0, cmd = time.time(), "python -m dynspec.benchmarks.draft_confidence " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        records, tables, check = measure(Path(args.pair or ASSET_DIR), args.prompts, args.new, args.k, args.prompt_len,
                                         not args.no_progress)
        res, t1 = evaluate(records, tables, args.new, args.k, args.w, args.refit, args.probe), time.time()
        write_json(args.out, {"command": cmd, "config": vars(args), "cross_check": check, "seconds": round(t1 - t0, 1),
                              "results": res, "records": flat_records(records)})
    except DynspecError as e:
        return print(f"error: {e}", file=sys.stderr) or 1
    return print(table(res)) or 0


if __name__ == "__main__":
    sys.exit(main())
