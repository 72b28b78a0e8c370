"""Triton python-backend model `dynspec`: the dynspec reference executor, in-process.

One executor serves every request: concurrent requests become one dynamic batch, so the draft
length K of each iteration follows the real concurrency. Engine dir and device come from the
parameters in config.pbtxt; the logic that does not need Triton lives in dynspec.triton_repo:
serving (model info, streamed detokenization), request_parsing and model_metrics.

Under `mpirun -n N python -m dynspec.triton_repo.launch REPO --tp N` the launcher puts
DYNSPEC_TP_* in this process's environment: the executor is then TP rank 0 of N
(dynspec.triton_repo.tp_ranks.TpLeader), the MPI ranks 1..N-1 run the other shards, and a fault of
the group fails every open and new request with its message.

Per-request acceptance: the final response of a request answered with its output (finish
"length" or "stop") carries accepted_drafts, drafted, decode_steps (INT32 [1]) and mean_k (FP32
[1]), the request's whole counts (serving.RequestAcceptance); the earlier responses of a stream
carry output_ids and text_output only. A request ended here by a stop word waits for the executor
to retire it (one iteration) so its counts are final. Those requests are also observed in
/metrics: dynspec_request_acceptance (accepted / drafted; requests that never drafted are not
observed) and dynspec_request_mean_k (requests with at least one decode iteration).
"""
import importlib.util
import json
import os
import queue
import site
import threading
import time

np = pb_utils = FINAL = None     # imported by initialize(), once python_site_packages is on the path


def _parameters(model_config):
    return {k: v.get("string_value", "") for k, v in model_config.get("parameters", {}).items()}


def _import_runtime(site_packages):
    """The stub runs the Python it finds first on PATH. If that is not dynspec's environment, add
    the site-packages folders named by the `python_site_packages` parameter (.pth files included,
    so editable installs work) before numpy, the backend utils and dynspec are imported."""
    global np, pb_utils, FINAL
    if importlib.util.find_spec("dynspec") is None:
        for folder in filter(None, site_packages.split(os.pathsep)):
            site.addsitedir(folder)
    if importlib.util.find_spec("dynspec") is None:
        raise ImportError(
            f"cannot import dynspec: not in this Python's path, nor in python_site_packages={site_packages!r}"
        )
    import numpy
    import triton_python_backend_utils

    np, pb_utils = numpy, triton_python_backend_utils
    FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


FINISH_WAIT_S = 10.0     # a request cut short here (stop word): its wait for the executor to retire it


def _response(ids, text, acceptance=None):
    """output_ids + text_output, and on a final response the request's RequestAcceptance outputs."""
    extra = [] if acceptance is None else [pb_utils.Tensor(name, value) for name, value in acceptance.outputs().items()]
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32)),
        pb_utils.Tensor("text_output", np.asarray([text.encode("utf-8")], dtype=np.object_)),
        *extra,
    ])



class _Live:
    """A request in flight. Once its final response is sent Triton releases the request, so
    nothing may touch it afterwards. Every call into Triton (sends, is_cancelled(), metrics)
    happens under the model's one lock: concurrent calls from several threads crash the
    python backend of Triton 2.51 (a SIGSEGV in libtriton_python.so under 16 concurrent streams)."""

    __slots__ = ("sender", "handle", "closed")

    def __init__(self, sender, handle):
        self.sender, self.handle, self.closed = sender, handle, False


class TritonPythonModel:
    def initialize(self, args):
        params = _parameters(json.loads(args["model_config"]))
        _import_runtime(params.get("python_site_packages", ""))
        from dynspec.config import EngineConfig
        from dynspec.errors import DynspecError
        from dynspec.runtime.serving.gc_heap import freeze_heap
        from dynspec.runtime.generate.session import open_executor
        from dynspec.triton_repo import launch, model_metrics, request_parsing, serving, tp_ranks

        self.serving, self.parsing, self.request_errors = serving, request_parsing, (DynspecError,)
        cfg = EngineConfig.load(params["engine_dir"])
        self.info = serving.with_prompt_bound(serving.load_model_info(cfg.target_dir), cfg.reference.max_seq_len)
        device = params.get("device") or "cpu"
        # The monitor reads only iterations newer than its cursor, so a short stats log is enough
        # (model_metrics.STATS_KEPT): an unbounded one grows the stub by ~2 KB per served request.
        kept = model_metrics.STATS_KEPT
        tp = launch.TpLaunch.from_env(os.environ)
        self.tp = None if tp is None else tp_ranks.TpLeader(tp, cfg, params["engine_dir"], device, kept)
        self.executor = self.tp.executor if self.tp is not None else \
            open_executor(cfg, device=device, stats_limit=kept)
        freeze_heap()        # the served heap out of the collector's walk (runtime/serving/gc_heap.py)
        max_draft_len = getattr(self.executor.engine, "max_draft_len", cfg.schedule.max_draft_len)
        self.metrics = model_metrics.ModelMetrics(
            pb_utils.MetricFamily, {"model": args["model_name"], "version": args["model_version"]}, max_draft_len)
        self.cursor = model_metrics.StatsCursor()
        self.live = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.interval = float(params.get("monitor_interval_ms") or 50) / 1000.0
        pb_utils.Logger.log_info(          # once per model load: what decides K
            f"dynspec: engine {params['engine_dir']} on {device}: "
            + serving.policy_line(cfg, self.executor.policy)
            + (f"; TP rank 0 of {tp.tp} (rendezvous {tp.endpoint})" if tp is not None else "")
        )
        self.executor.start()
        self.monitor = threading.Thread(target=self._monitor, name="dynspec-monitor", daemon=True)
        self.monitor.start()

    def execute(self, requests):
        for request in requests:
            self._accept(request)
        return None

    def _fault(self):
        """Why the TP group is gone (every request fails with it), or None."""
        return None if self.tp is None else self.tp.fault()

    def _accept(self, request):
        """On Triton's execute thread: take the inputs and hand them to a thread of their own,
        which parses (tokenizes) and serves them, so a huge prompt holds up no other request."""
        sender = request.get_response_sender()
        fault = self._fault()
        if fault is not None:
            with self.lock:
                self.metrics.rejected("tp_fault")
                sender.send(_error(f"tensor-parallel group failed: {fault}", pb_utils.TritonError.UNAVAILABLE),
                            flags=FINAL)
            return
        try:
            parameters = json.loads(request.parameters() or "{}")
            inputs = {}
            for name in self.parsing.INPUT_NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
        except Exception as e:
            self._refuse(sender, e)
            return
        threading.Thread(target=self._start, args=(sender, parameters, inputs), daemon=True).start()

    def _refuse(self, sender, e):
        known = isinstance(e, self.request_errors)
        message, code = (str(e), pb_utils.TritonError.INVALID_ARG) if known else \
            (f"internal error: {e}", pb_utils.TritonError.INTERNAL)
        with self.lock:
            if not known:
                pb_utils.Logger.log_error(f"dynspec: cannot accept request: {e!r}")
            self.metrics.rejected("invalid_argument" if known else "internal")
            sender.send(_error(message, code), flags=FINAL)

    def _start(self, sender, parameters, inputs):
        try:
            self.parsing.check_parameters(parameters)
            req = self.parsing.parse_request(inputs, self.info)
            with self.lock:
                gone = sender.is_cancelled()
            if gone:                            # its client left while it was parsed
                with self.lock:
                    self.metrics.finished("cancelled")
                    sender.send(_error("request cancelled", pb_utils.TritonError.CANCELLED), flags=FINAL)
                return
            handle = self.executor.submit(req.prompt_ids, req.max_tokens, req.stop_ids)
        except Exception as e:
            self._refuse(sender, e)
            return
        live = _Live(sender, handle)
        with self.lock:
            self.live[handle.id] = live
        self._respond(live, req)

    def _send(self, live, response, final=False):
        with self.lock:
            if live.closed:
                return
            try:
                live.sender.send(response, flags=FINAL if final else 0)
            finally:
                if final:
                    live.closed, live.sender = True, None
                    self.live.pop(live.handle.id, None)

    def _respond(self, live, req):
        handle = live.handle
        prefix = () if req.exclude_input else req.prompt_ids   # exclude_input_in_output=false: prompt first
        text = self.serving.TextStream(self.info.decode, prefix)
        watch = self.serving.OutputWatch(req)
        ids, end = list(prefix), None       # stream: ids not sent yet; otherwise: every id
        recorded = False
        try:
            for chunk in handle.stream():
                keep, end = watch.push(chunk)
                if not req.stream:
                    ids.extend(keep)
                elif keep:
                    self._send(live, _response(ids + keep, text.push(keep)))
                    ids = []
                if end is not None:
                    break
            if end is not None:
                handle.cancel()             # a stop word or a refusal ends it before the executor would
            reason = "stop" if end == "stop" else "refused" if end else handle.result().finish_reason
            counts = self._acceptance(handle) if reason in ("length", "stop") else None
            fault = self._fault() if reason in ("error", "cancelled") else None
            if fault is not None:
                reason = "tp_fault"
                last = _error(f"tensor-parallel group failed: {fault}", pb_utils.TritonError.UNAVAILABLE)
            elif reason == "refused":
                last = _error(end, pb_utils.TritonError.INVALID_ARG)
            elif reason == "cancelled":
                last = _error("request cancelled", pb_utils.TritonError.CANCELLED)
            elif reason not in ("length", "stop"):
                last = _error(f"generation failed ({reason})", pb_utils.TritonError.INTERNAL)
            else:
                last = _response(ids, text.flush() if req.stream else self.info.decode(ids), counts)
            with self.lock:                 # before the reply: a client holding its answer finds it in /metrics
                self.metrics.finished(reason)
                if reason in ("length", "stop"):
                    self.metrics.observe(counts)
            recorded = True
            self._send(live, last, final=True)
        except Exception as e:
            handle.cancel()
            with self.lock:
                pb_utils.Logger.log_warn(f"dynspec: request {handle.id} dropped: {e!r}")
                if not recorded:
                    self.metrics.finished("dropped")
            try:
                self._send(live, _error(f"request dropped: {e}", pb_utils.TritonError.INTERNAL), final=True)
            except Exception:
                pass

    def _acceptance(self, handle):
        """The finished request's serving.RequestAcceptance; one cut short here (stop word, cancelled)
        first waits for the executor to retire it. None if it is not retired within FINISH_WAIT_S."""
        try:
            if not handle.done:             # its stream still open: read up to its end
                for _ in handle.stream(timeout=FINISH_WAIT_S):
                    pass
        except queue.Empty:
            return None
        # the executor counts a step's drafts before it appends the step's tokens: a finished
        # request's counts are whole
        return self.serving.RequestAcceptance.of(handle.result())

    def _monitor(self):
        reported = None
        while not self.stopping.wait(self.interval):
            try:
                if self.tp is not None and reported is None:
                    reported = self.tp.report()         # the launcher stops the server on it
                    if reported is not None:
                        with self.lock:
                            pb_utils.Logger.log_error(f"dynspec: tensor-parallel group failed: {reported}")
                            waiting = [live.handle for live in self.live.values() if not live.handle.done]
                        for handle in waiting:          # those still queued would wait on a dead group
                            handle.cancel()
                with self.lock:
                    gone = [live.handle for live in self.live.values()
                            if not live.closed and not live.handle.done and live.sender.is_cancelled()]
                for handle in gone:                 # outside the lock: cancel() may wait on the executor
                    handle.cancel()
                busy = self.executor.active + self.executor.waiting > 0
                sample = self.cursor.sample(self.executor.stats_since(self.cursor.next), busy)
                with self.lock:
                    self.metrics.update(sample)
            except Exception as e:                  # keep cancellation and metrics alive
                with self.lock:
                    pb_utils.Logger.log_error(f"dynspec: monitor: {e!r}")

    def finalize(self):
        with self.lock:
            handles = [live.handle for live in self.live.values()]
        for handle in handles:
            handle.cancel()
        deadline = time.monotonic() + 5.0
        while any(not h.done for h in handles) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            self.executor.stop()
        finally:
            self.stopping.set()
            self.monitor.join(timeout=5.0)
            if self.tp is not None:                     # STOP to the workers: they leave, mpirun exits 0
                problem = self.tp.close()
                if problem is not None:
                    pb_utils.Logger.log_warn(f"dynspec: tensor-parallel shutdown: {problem}")
