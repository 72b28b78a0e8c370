"""Soak the reference Triton model: mixed good, malformed, cancelled and disconnected load on
loopback for a fixed time, RSS of tritonserver and of the python stub sampled at a fixed period,
and a final check that no process of the server group and no /dev/shm region of the launch is left.

    python -m dynspec.benchmarks.triton_soak --minutes 10 --out triton_soak.json --plot triton_soak.png

Load (per client thread, a fixed rotation of 20 slots; modest: 2 clients on a 2-core box):
    good_grpc  8/20  streamed gRPC request, 16 new tokens; any error is a failure
    good_http  4/20  HTTP generate, 16 new tokens; anything but 200 with 16 ids is a failure
    malformed  3/20  one of MALFORMED; it must be refused with its message, and it is counted
    cancelled  3/20  gRPC stream cancelled by the client after its first response
    disconnect 2/20  HTTP generate_stream whose socket is closed after the first bytes

gRPC: a new connection per request by default; --reuse-grpc keeps one per client (perf_analyzer's
way). tritonserver 2.51 grows by ~1.5 KB per new gRPC connection, not per stream or request.

RSS slope: least squares over the samples after the warm-up (the first 2 minutes, or the first
third of a shorter run), in KB per minute. JSON keys: config, counts, failures, samples
([t_s, tritonserver_kb, stub_kb]), slope_kb_per_min {tritonserver, stub}, left_behind.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MODEL = "dynspec"
NEW_TOKENS = 16
ROTATION = ("good_grpc",) * 8 + ("good_http",) * 4 + ("malformed",) * 3 + ("cancelled",) * 3 + ("disconnect",) * 2

# (json body for HTTP generate, text the error must contain)
MALFORMED = (
    ({"input_ids": [1, 2, 3]}, "max_tokens"),
    ({"input_ids": [1, 10**6], "max_tokens": 4}, "outside the vocabulary"),
    ({"max_tokens": 4}, "neither 'text_input'"),
    ({"input_ids": [5, 6], "max_tokens": 0}, "max_tokens=0"),
    ({"input_ids": [5, 6], "max_tokens": 4, "temperature": 0.7}, "temperature"),
)


@dataclass
class Tally:
    counts: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, failure: str | None = None) -> None:
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if failure is not None and len(self.failures) < 50:
                self.failures.append(f"{kind}: {failure}")


def _inputs(prompt, max_tokens, stream=True):
    import tritonclient.grpc as grpcclient

    out = []
    for name, value, dtype, triton in (("input_ids", prompt, np.int32, "INT32"), ("max_tokens", [max_tokens], np.int32,
                                       "INT32"), ("stream", [stream], np.bool_, "BOOL")):
        arr = np.asarray(value, dtype=dtype)
        t = grpcclient.InferInput(name, list(arr.shape), triton)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


def grpc_request(url, prompt, max_tokens, cancel_after_first=False, timeout=120.0, client=None):
    """-> (number of ids, error message or None); with cancel_after_first, cancel once one response came.
    client: a gRPC client to reuse (one connection, a new stream per request); None: a new connection."""
    import tritonclient.grpc as grpcclient

    own = client is None
    client = grpcclient.InferenceServerClient(url) if own else client
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    n = 0
    try:
        client.async_stream_infer(MODEL, _inputs(prompt, max_tokens))
        deadline = time.monotonic() + timeout
        while True:
            result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                return n, error.message()
            n += len(result.as_numpy("output_ids"))
            if cancel_after_first:
                client.stop_stream(cancel_requests=True)
                return n, None
            if result.get_response().parameters["triton_final_response"].bool_param:
                return n, None
    finally:
        client.stop_stream(cancel_requests=True)
        if own:
            client.close()


def http_generate(host, port, body, timeout=120.0):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", f"/v2/models/{MODEL}/generate", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"{}")
    finally:
        conn.close()


def http_disconnect(host, port, prompt, max_tokens):
    """Start a generate_stream request and close the socket once the first bytes of the answer came."""
    body = json.dumps({"input_ids": prompt, "max_tokens": max_tokens, "stream": True}).encode()
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(f"POST /v2/models/{MODEL}/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        return len(s.recv(256))


def client_loop(server, vocab, deadline, seed, tally, pause_s, reuse_grpc):
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(seed)
    client = grpcclient.InferenceServerClient(server.grpc_url) if reuse_grpc else None
    host, http_port = server.host, server.ports.http
    i = 0
    while time.monotonic() < deadline:
        kind = ROTATION[i % len(ROTATION)]
        i += 1
        prompt = rng.integers(3, vocab, size=int(rng.integers(4, 24))).tolist()
        try:
            if kind == "good_grpc":
                n, err = grpc_request(server.grpc_url, prompt, NEW_TOKENS, client=client)
                tally.add(kind, err if err else (None if 1 <= n <= NEW_TOKENS else f"{n} ids"))
            elif kind == "good_http":
                status, reply = http_generate(host, http_port, {"input_ids": prompt, "max_tokens": NEW_TOKENS})
                ok = status == 200 and 1 <= len(reply.get("output_ids", [])) <= NEW_TOKENS
                tally.add(kind, None if ok else f"HTTP {status}: {reply}")
            elif kind == "malformed":
                body, want = MALFORMED[(i // len(ROTATION)) % len(MALFORMED)]
                status, reply = http_generate(host, http_port, body)
                ok = status == 400 and want in str(reply.get("error", ""))
                tally.add(kind, None if ok else f"{body} -> HTTP {status}: {reply}")
            elif kind == "cancelled":
                n, err = grpc_request(server.grpc_url, prompt, 200, cancel_after_first=True, client=client)
                tally.add(kind, err)
            else:
                got = http_disconnect(host, http_port, prompt, 200)
                tally.add(kind, None if got else "no bytes before the disconnect")
        except Exception as e:              # a client-side failure is a soak failure, not a crash
            tally.add(kind, repr(e))
        time.sleep(pause_s)
    if client is not None:
        client.close()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def stub_pids(server_pid: int) -> list[int]:
    from dynspec.triton_repo.ports import parent_pids

    pids = []
    for pid, parent in parent_pids().items():
        if parent == server_pid:
            with contextlib.suppress(OSError):
                if b"triton_python_backend_stub" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(pid)
    return pids


def slope_kb_per_min(samples, column, warmup_s):
    """Least-squares slope of samples[:, column] over samples[:, 0] (s), after warmup_s; KB/min."""
    a = np.asarray([s for s in samples if s[0] >= warmup_s], dtype=float)
    if len(a) < 2:
        return None
    return float(np.polyfit(a[:, 0] / 60.0, a[:, column], 1)[0])


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def soak(minutes: float, clients: int = 2, sample_s: float = 30.0, pause_s: float = 0.05, seed: int = 0,
         workdir: Path | None = None, reuse_grpc: bool = False, progress: bool = False) -> dict:
    """Launch the tiny pair's Triton model, run the load for `minutes`, stop the server; the result
    dict (module docstring's JSON keys). progress: a tqdm bar over the run's seconds on stderr, its
    postfix the requests done, the failures and the last RSS sample."""
    from dynspec.config import EngineConfig, ReferenceSettings
    from dynspec.runtime.policy import DraftSchedule
    from dynspec.runtime.generate.session import tiny_pair_dirs
    from dynspec.triton_repo.generate import generate_repo
    from dynspec.triton_repo.serving import load_model_info
    from dynspec.triton_repo.server_process import launch

    tmp = Path(workdir or tempfile.mkdtemp(prefix="dynspec-soak-"))
    target, draft = tiny_pair_dirs()
    cfg = EngineConfig(target_dir=str(target), draft_dir=str(draft),
                       schedule=DraftSchedule.threshold(max_draft_len=4, disable_above=4), tp=1,
                       reference=ReferenceSettings(max_batch_size=8, max_seq_len=512))
    cfg.write(tmp / "engine")
    repo = generate_repo(tmp / "engine", tmp / "repo", force=True)
    vocab = load_model_info(target, with_tokenizer=False).vocab_size
    server = launch(repo, log_path=tmp / "tritonserver.log", ready_timeout_s=180, env={"OMP_NUM_THREADS": "1"})
    tally, samples = Tally(), []
    alive_at_end = False
    try:
        stubs = stub_pids(server.proc.pid)
        t0 = time.monotonic()
        deadline = t0 + minutes * 60.0
        threads = [threading.Thread(target=client_loop, daemon=True,
                                    args=(server, vocab, deadline, seed + c, tally, pause_s, reuse_grpc))
                   for c in range(clients)]
        for t in threads:
            t.start()
        next_sample = t0
        bar = _bar(minutes) if progress else None
        while time.monotonic() < deadline:
            if time.monotonic() >= next_sample:
                stubs = stub_pids(server.proc.pid) or stubs
                samples.append((round(time.monotonic() - t0, 1), rss_kb(server.proc.pid),
                                sum(rss_kb(p) for p in stubs)))
                next_sample += sample_s
            time.sleep(min(1.0, max(0.0, next_sample - time.monotonic())))
            if bar is not None:
                _show(bar, time.monotonic() - t0, tally, samples[-1])
        if bar is not None:
            bar.close()
        for t in threads:
            t.join(180)
        samples.append((round(time.monotonic() - t0, 1), rss_kb(server.proc.pid), sum(rss_kb(p) for p in stubs)))
        alive_at_end = server.proc.poll() is None
    finally:
        server.stop()
    left = {"processes": _group_alive(server.proc.pid), "shm_regions": server.shm_regions()}
    warmup_s = min(120.0, minutes * 60.0 / 3)
    return {
        "config": {"minutes": minutes, "clients": clients, "sample_s": sample_s, "new_tokens": NEW_TOKENS,
                   "pause_s": pause_s, "reuse_grpc": reuse_grpc, "rotation": list(ROTATION), "warmup_s": warmup_s,
                   "schedule": "4:4", "max_batch_size": 8},
        "counts": tally.counts,
        "failures": tally.failures,
        "server_alive_at_end": alive_at_end,
        "samples": samples,
        "slope_kb_per_min": {"tritonserver": slope_kb_per_min(samples, 1, warmup_s),
                             "stub": slope_kb_per_min(samples, 2, warmup_s)},
        "left_behind": left,
    }


def _bar(minutes: float):
    from tqdm import tqdm

    return tqdm(total=round(minutes * 60.0), unit="s", desc="soak", dynamic_ncols=True, file=sys.stderr)


def _show(bar, elapsed_s: float, tally: Tally, sample: tuple) -> None:
    """Move the bar to `elapsed_s`; postfix: requests so far, failures, tritonserver and stub RSS (MiB)."""
    bar.update(max(0, min(bar.total, round(elapsed_s)) - bar.n))
    with tally.lock:
        done, failed = sum(tally.counts.values()), len(tally.failures)
    bar.set_postfix_str(f"{done} requests, {failed} failures, RSS {sample[1] / 1024:.0f}+{sample[2] / 1024:.0f} MiB",
                        refresh=False)


def plot(result: dict, path: Path) -> None:
    """RSS over time, one panel per process (their scales differ by 10x), with the fitted slope."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a = np.asarray(result["samples"], dtype=float)
    warm = result["config"]["warmup_s"] / 60.0
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharex=True)
    for ax, col, key, name in ((axes[0], 1, "tritonserver", "tritonserver"), (axes[1], 2, "stub", "python stub")):
        slope = result["slope_kb_per_min"][key]
        ax.plot(a[:, 0] / 60.0, a[:, col] / 1024.0, marker="o")
        ax.axvline(warm, color="grey", ls=":")
        title = f"{name}: {slope:+.0f} KB/min after warm-up" if slope is not None else name
        ax.set(xlabel="minutes", ylabel="RSS (MiB)", title=title)
    n = sum(result["counts"].values())
    grpc = "one gRPC connection per client" if result["config"].get("reuse_grpc") else \
        "a new gRPC connection per request"
    fig.suptitle(f"Triton soak: {n} requests, {len(result['failures'])} failures ({grpc})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def make_parser() -> argparse.ArgumentParser:
    from dynspec.parsers import DefaultsFormatter

    p = argparse.ArgumentParser(prog="python -m dynspec.benchmarks.triton_soak", allow_abbrev=False,
                                description=" ".join(__doc__.split("\n\n")[0].split()),
                                formatter_class=DefaultsFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs")
    p.add_argument("--clients", type=int, default=2, help="client threads, each its own rotation of requests")
    p.add_argument("--sample-s", type=float, default=30.0, help="seconds between RSS samples")
    p.add_argument("--pause-s", type=float, default=0.05, help="pause of each client between requests")
    p.add_argument("--reuse-grpc", action="store_true",
                   help="one gRPC connection per client (a new stream per request), as perf_analyzer does; "
                        "default: a new connection per gRPC request")
    p.add_argument("--out", type=Path, required=True, help="the result JSON")
    p.add_argument("--plot", type=Path, help="RSS over time, PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    if not (args.minutes > 0 and args.clients >= 1 and args.sample_s > 0):
        print(f"error: --minutes {args.minutes}, --clients {args.clients} and --sample-s {args.sample_s} "
              "must be positive", file=sys.stderr)
        return 2
    result = soak(args.minutes, args.clients, args.sample_s, args.pause_s, reuse_grpc=args.reuse_grpc,
                  progress=not args.no_progress)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)
    ok = not result["failures"] and result["server_alive_at_end"] and not result["left_behind"]["processes"] \
        and not result["left_behind"]["shm_regions"]
    print(json.dumps({k: result[k] for k in ("counts", "slope_kb_per_min", "left_behind")}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
