"""The reference model repository served by a real `tritonserver` (the binary and python backend
that the nvidia-pytriton wheel ships) on CPU, with the embedded tiny target + EAGLE-3 pair.

Oracle: the same reference executor run offline in this process (it is lossless: equal to the
target's greedy decoding). Schedule: K=4 up to batch 4, K=0 above, so 16 concurrent requests
must push the draft length on /metrics from 4 to 0.

The first tests need no server: request parsing, streamed detokenization and the stats cursor.
"""
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from dynspec.config import EngineConfig, ReferenceSettings
from dynspec.runtime.serving.executor import IterationStats
from dynspec.runtime.policy import DraftSchedule
from dynspec.triton_repo.model_metrics import StatsCursor
from dynspec.triton_repo.request_acceptance import ACCEPTANCE_BUCKETS, ACCEPTANCE_OUTPUTS, mean_k_buckets
from dynspec.triton_repo.request_parsing import RequestError, check_parameters, parse_request
from dynspec.triton_repo.serving import ModelInfo, TextStream, load_model_info
from dynspec.triton_repo.words import OutputWatch
from tests.helpers_metrics import metric, metrics, settle
from tests.test_request_acceptance import delta, expected_buckets, histogram

MODEL = "dynspec"
SCHEDULE = DraftSchedule.threshold(max_draft_len=4, disable_above=4)
MAX_SEQ_LEN = 1024
MAX_BATCH = 24
NEW_TOKENS = 32


# ---- no server ----------------------------------------------------------------------------------
class FakeTokenizer:
    def encode(self, text):
        return [ord(c) % 50 + 1 for c in text]


INFO = ModelInfo(vocab_size=100, eos_ids=(2,), tokenizer=FakeTokenizer())


def ids(*v, dtype=np.int32):
    return np.array(v, dtype=dtype)


def test_parse_request_good():
    r = parse_request({"input_ids": ids(5, 6, 7), "max_tokens": ids(8)}, INFO)
    assert (r.prompt_ids, r.max_tokens, r.stream, r.stop_ids) == ((5, 6, 7), 8, False, (2,))
    r = parse_request({"text_input": np.array([b"hi"], dtype=object), "max_tokens": ids(3),
                       "stream": np.array([True]), "end_id": ids(-1)}, INFO)
    assert (r.prompt_ids, r.stream, r.stop_ids) == (tuple(FakeTokenizer().encode("hi")), True, ())
    assert parse_request({"input_ids": ids(1, 2, dtype=np.int32).reshape(1, 2), "max_tokens": ids(1),
                          "end_id": ids(9)}, INFO).stop_ids == (9,)


@pytest.mark.parametrize("inputs,match", [
    ({"max_tokens": ids(4)}, "neither 'text_input' .* nor 'input_ids'"),
    ({"input_ids": ids(1), "text_input": np.array([b"x"], dtype=object), "max_tokens": ids(4)}, "both"),
    ({"input_ids": np.array([1.0], dtype=np.float32), "max_tokens": ids(4)}, "'input_ids' has dtype float32"),
    ({"input_ids": ids(1), "max_tokens": np.array([4.0], dtype=np.float32)}, "'max_tokens' has dtype float32"),
    ({"input_ids": ids(1), "max_tokens": ids(0)}, r"max_tokens=0 must be at least 1"),
    ({"input_ids": ids(1), "max_tokens": ids(-5)}, r"max_tokens=-5 must be at least 1"),
    ({"input_ids": ids(1), "max_tokens": ids(2, 3)}, "exactly one value"),
    ({"input_ids": ids(1)}, "no 'max_tokens'"),
    ({"input_ids": ids(1, 100), "max_tokens": ids(1)}, r"'input_ids'\[1\] = 100 is outside the vocabulary 0..99"),
    ({"input_ids": ids(), "max_tokens": ids(1)}, "prompt is empty"),
    ({"text_input": np.array([b"ok \xff\xfe"], dtype=object), "max_tokens": ids(1)},
     r"not valid UTF-8: byte 0xff at offset 3"),
    ({"text_input": np.array([b"a", b"b"], dtype=object), "max_tokens": ids(1)}, "exactly one prompt"),
])
def test_parse_request_errors(inputs, match):
    with pytest.raises(RequestError, match=match):
        parse_request(inputs, INFO)


def f32(v):
    return np.array([v], dtype=np.float32)


def words(*w):
    return np.array([x.encode() for x in w], dtype=object)


def test_parse_request_options_honoured():
    r = parse_request({"input_ids": ids(5, 6), "max_tokens": ids(8), "exclude_input_in_output": np.array([False]),
                       "min_length": ids(3), "stop_words": words("ab", "c"), "bad_words": words("zz"),
                       "pad_id": ids(0), "length_penalty": f32(2.0), "random_seed": np.array([7], np.uint64),
                       "seed": np.array([7], np.uint64)}, INFO)
    enc = FakeTokenizer().encode
    assert (r.exclude_input, r.min_length, r.stop_words, r.bad_words) == \
        (False, 3, (tuple(enc("ab")), tuple(enc("c"))), (("zz", tuple(enc("zz"))),))
    assert parse_request({"input_ids": ids(5), "max_tokens": ids(8)}, INFO).exclude_input is True
    assert parse_request({"input_ids": ids(5), "max_tokens": ids(8), "min_tokens": ids(4)}, INFO).min_length == 4
    # neutral values of what only sampling, beams or log probs would use
    greedy = {"temperature": f32(1.0), "top_k": ids(1), "top_p": f32(0.0), "repetition_penalty": f32(1.0),
              "presence_penalty": f32(0.0), "frequency_penalty": f32(0.0), "beam_width": ids(1),
              "num_return_sequences": ids(1), "return_log_probs": np.array([False]),
              "return_context_logits": np.array([False]), "return_generation_logits": np.array([False])}
    assert parse_request({"input_ids": ids(5), "max_tokens": ids(8), **greedy}, INFO).max_tokens == 8
    # top_k 1 is argmax whatever the temperature and top_p
    parse_request({"input_ids": ids(5), "max_tokens": ids(8), "top_k": ids(1), "temperature": f32(0.3),
                   "top_p": f32(0.9)}, INFO)


@pytest.mark.parametrize("extra,match", [
    ({"temperature": f32(0.7)}, r"temperature=0.7 is not supported.*greedily"),
    ({"top_k": ids(40)}, r"top_k=40 asks for sampling"),
    ({"top_p": f32(0.9)}, r"top_p=0.9 asks for sampling"),
    ({"top_k": ids(0), "top_p": f32(1.0)}, r"top_p=1 asks for sampling"),
    ({"top_p": f32(1.5)}, r"top_p=1.5 is outside 0..1"),
    ({"beam_width": ids(4)}, r"beam_width=4 is not supported"),
    ({"num_return_sequences": ids(2)}, r"num_return_sequences=2 is not supported"),
    ({"repetition_penalty": f32(1.2)}, r"repetition_penalty=1.2 is not supported"),
    ({"presence_penalty": f32(0.5)}, r"presence_penalty=0.5"),
    ({"frequency_penalty": f32(0.5)}, r"frequency_penalty=0.5"),
    ({"return_log_probs": np.array([True])}, r"return_log_probs=true is not supported"),
    ({"return_generation_logits": np.array([True])}, r"return_generation_logits=true"),
    ({"min_length": ids(-1)}, r"min_length=-1 must be at least 0"),
    ({"min_length": ids(3), "min_tokens": ids(4)}, r"min_length=3 and min_tokens=4 disagree"),
    ({"stop_words": words("")}, r"'stop_words' holds '', which has no tokens"),
    ({"bad_words": ids(3)}, r"'bad_words' has dtype int32; expected BYTES"),
    ({"exclude_input_in_output": ids(1)}, r"'exclude_input_in_output' has dtype int32; expected BOOL"),
    ({"temperature": np.array([b"hot"], dtype=object)}, r"'temperature' has dtype object"),
])
def test_parse_request_refuses_what_greedy_decoding_cannot_give(extra, match):
    with pytest.raises(RequestError, match=match):
        parse_request({"input_ids": ids(5), "max_tokens": ids(8), **extra}, INFO)


def test_unknown_request_parameters_are_refused():
    check_parameters({})
    with pytest.raises(RequestError, match=r"unsupported request parameter\(s\) 'ignore_eos', 'typo'"):
        check_parameters({"typo": 1, "ignore_eos": True})


def watch(**kw):
    base = dict(prompt_ids=(1,), max_tokens=32, stream=True, stop_ids=(2,))
    from dynspec.triton_repo.request_parsing import GenerateRequest

    return OutputWatch(GenerateRequest(**{**base, **kw}))


def test_output_watch_stop_words_end_the_output_after_the_word():
    w = watch(stop_words=((7, 8),))
    assert w.push([5, 7]) == ([5, 7], None)
    assert w.push([8, 9, 10]) == ([8], "stop")            # the word spans two chunks
    assert watch(stop_words=((9,), (7, 8))).push([5, 7, 8, 9]) == ([5, 7, 8], "stop")


def test_output_watch_refuses_bad_words_and_early_end_id():
    keep, end = watch(bad_words=(("x y", (3, 4)),)).push([3, 5, 3, 4, 6])
    assert keep == [3, 5, 3] and "bad_words: greedy decoding produces 'x y' at output token 2" in end
    keep, end = watch(bad_words=(("x", (3,)),)).push([3])
    assert keep == [] and "produces 'x' at output token 0" in end
    keep, end = watch(min_length=4).push([5, 6, 2])
    assert keep == [5, 6] and "min_length=4: greedy decoding reaches end_id 2 after 2 tokens" in end
    assert watch(min_length=2).push([5, 6, 2]) == ([5, 6, 2], None)   # the executor ends it ("stop")
    assert watch(min_length=9, stop_ids=()).push([5, 2, 2]) == ([5, 2, 2], None)


def test_text_stream_with_a_prefix_starts_with_it():
    decode = lambda toks: "".join(chr(96 + t) for t in toks)  # noqa: E731
    ts = TextStream(decode, prefix=[1, 2])
    assert [ts.push([3]), ts.push([4]), ts.flush()] == ["abc", "d", ""]


def test_text_input_needs_a_tokenizer():
    with pytest.raises(RequestError, match="no tokenizer"):
        parse_request({"text_input": np.array([b"x"], dtype=object), "max_tokens": ids(1)},
                      ModelInfo(100, (), None))


def test_text_stream_holds_back_partial_characters():
    table = {1: b"a", 2: b"\xc3", 3: b"\xa9", 4: b"!"}
    decode = lambda toks: b"".join(table[t] for t in toks).decode("utf-8", errors="replace")  # noqa: E731
    ts = TextStream(decode)
    deltas = [ts.push([1]), ts.push([2]), ts.push([3, 4]), ts.flush()]
    assert deltas == ["a", "", "é!", ""]
    assert "".join(deltas) == decode([1, 2, 3, 4])


def test_stats_cursor_reports_new_iterations_only():
    def st(i, b, k, acc):
        return IterationStats(i, b, k, b * k, acc, b, 0.0, 0.0)

    c = StatsCursor()
    assert c.sample((), busy=False).draft_len is None
    stats = (st(0, 1, 4, 3), st(1, 2, 4, 5))
    s = c.sample(stats, busy=True)
    assert (s.draft_len, s.batch_size, s.drafted, s.accepted, dict(s.iterations_by_k)) == (4, 2, 12, 8, {4: 2})
    stats += (st(2, 6, 0, 0),)
    s = c.sample(stats, busy=True)
    assert (s.draft_len, s.batch_size, s.drafted, dict(s.iterations_by_k)) == (0, 6, 0, {0: 1})
    assert c.sample(stats, busy=True).batch_size == 6
    s = c.sample(stats, busy=False)
    assert (s.draft_len, s.batch_size, s.drafted, dict(s.iterations_by_k)) == (0, 0, 0, {})
    # a bounded log that has dropped its oldest entries: only iteration numbers count
    s = c.sample((st(2, 6, 0, 0), st(3, 1, 4, 2)), busy=True)
    assert (s.draft_len, s.drafted, dict(s.iterations_by_k)) == (4, 4, {4: 1}) and c.next == 4
    # a prompt-only iteration (no decode row, b = 0) is no K=0 iteration and leaves the gauges
    s = c.sample((st(4, 0, 0, 0),), busy=True)
    assert (s.draft_len, s.batch_size, dict(s.iterations_by_k)) == (4, 1, {}) and c.next == 5
    # the collector's pauses of every new iteration, prompt-only ones too
    s = c.sample((replace(st(5, 0, 0, 0), gc_seconds=0.002), replace(st(6, 1, 4, 1), gc_seconds=0.001)), busy=True)
    assert s.gc_seconds == pytest.approx(0.003) and c.sample((), busy=True).gc_seconds == 0.0


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dynspec.runtime.generate.session import tiny_pair_dirs

    target, draft = tiny_pair_dirs()
    if not Path(target, "config.json").is_file():
        pytest.fail(f"the embedded tiny pair is missing: {target}")
    root = tmp_path_factory.mktemp("engine")
    cfg = EngineConfig(target_dir=str(target), draft_dir=str(draft), schedule=SCHEDULE, tp=1,
                       reference=ReferenceSettings(max_batch_size=MAX_BATCH, max_seq_len=MAX_SEQ_LEN))
    cfg.write(root)
    return root


@pytest.fixture(scope="module")
def info(engine):
    return load_model_info(EngineConfig.load(engine).target_dir)


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    """tritonserver in its own process group: 120 s to become ready, always stopped, none left."""
    from dynspec.triton_repo.generate import generate_repo
    from dynspec.triton_repo.server_process import launch

    root = tmp_path_factory.mktemp("triton")
    repo = generate_repo(engine, root / "repo")
    srv = launch(repo, log_path=root / "tritonserver.log", ready_timeout_s=120, env={"OMP_NUM_THREADS": "1"})
    try:
        yield srv
    finally:
        srv.stop()
        with pytest.raises(ProcessLookupError):
            os.killpg(srv.proc.pid, 0)


@pytest.fixture(scope="module")
def oracle(engine):
    """prompt ids, max tokens, stop ids -> the reference executor's output, run offline here
    (one torch thread: the server and the clients share the two cores)."""
    import torch

    from dynspec.runtime.generate.session import open_executor

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ex = open_executor(EngineConfig.load(engine))

    def run(jobs):
        handles = [ex.submit(p, n, stop) for p, n, stop in jobs]
        ex.run_until_idle()
        run.results = [h.result() for h in handles]      # the RequestResults, for their counts
        return [tuple(r.output_ids) for r in run.results]

    try:
        yield run
    finally:
        torch.set_num_threads(threads)


@dataclass
class Reply:
    ids: list = field(default_factory=list)
    texts: list = field(default_factory=list)
    error: str | None = None
    responses: int = 0
    counts: dict = field(default_factory=dict)     # the final response's ACCEPTANCE_OUTPUTS
    early_counts: int = 0                           # ... found on an earlier response (none should be)


def tensor(name, value, dtype):
    import tritonclient.grpc as grpcclient

    arr = np.asarray(value, dtype=dtype)
    t = grpcclient.InferInput(name, list(arr.shape), {np.int32: "INT32", np.float32: "FP32", np.bool_: "BOOL",
                                                     np.object_: "BYTES"}[np.dtype(dtype).type])
    t.set_data_from_numpy(arr)
    return t


def request(*, text=None, prompt_ids=None, max_tokens=NEW_TOKENS, stream=True, end_id=None):
    inputs = []
    if text is not None:
        inputs.append(tensor("text_input", [text.encode() if isinstance(text, str) else text], np.object_))
    if prompt_ids is not None:
        inputs.append(tensor("input_ids", prompt_ids, np.int32))
    if max_tokens is not None:
        inputs.append(tensor("max_tokens", [max_tokens], np.int32))
    inputs.append(tensor("stream", [stream], np.bool_))
    if end_id is not None:
        inputs.append(tensor("end_id", [end_id], np.int32))
    return inputs


def call(server, inputs, timeout=120.0) -> Reply:
    """One request on its own gRPC stream; collect every response up to the final one."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    reply = Reply()
    try:
        client.async_stream_infer(MODEL, inputs)
        deadline = time.monotonic() + timeout
        while True:
            result, error = q.get(timeout=max(0.1, deadline - time.monotonic()))
            reply.responses += 1
            if error is not None:
                reply.error = error.message()
                return reply
            reply.ids += result.as_numpy("output_ids").tolist()
            reply.texts += [t.decode() for t in result.as_numpy("text_output")]
            counts = {name: result.as_numpy(name) for name in ACCEPTANCE_OUTPUTS}
            if result.get_response().parameters["triton_final_response"].bool_param:
                reply.counts = {name: a.item() for name, a in counts.items() if a is not None}
                return reply
            reply.early_counts += sum(a is not None for a in counts.values())
    finally:
        client.stop_stream()
        client.close()


def prompts(info, n_text, n_ids, seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "draft", "model", "speaks", "first", "and", "target", "checks", "every", "token"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(3, 9)))) for _ in range(n_text)]
    id_prompts = [rng.integers(3, info.vocab_size, size=int(rng.integers(4, 24))).tolist() for _ in range(n_ids)]
    return texts, id_prompts


@pytest.mark.slow
def test_single_request_speculates_at_full_k(server, info, oracle):
    before = metrics(server)
    prompt = prompts(info, 0, 1, seed=1)[1][0]
    reply = call(server, request(prompt_ids=prompt))
    assert reply.error is None
    assert tuple(reply.ids) == oracle([(prompt, NEW_TOKENS, info.eos_ids)])[0]
    assert reply.responses >= 2
    k4 = metric(before, "dynspec_iterations_total", k="4")
    after = settle(server, lambda m: metric(m, "dynspec_batch_size") == 0
                   and metric(m, "dynspec_iterations_total", k="4") > k4)     # a gauge sampled after the request
    assert metric(after, "dynspec_draft_length") == 4
    assert metric(after, "dynspec_iterations_total", k="0") == metric(before, "dynspec_iterations_total", k="0")
    drafted = metric(after, "dynspec_drafted_tokens_total") - metric(before, "dynspec_drafted_tokens_total")
    accepted = metric(after, "dynspec_accepted_tokens_total") - metric(before, "dynspec_accepted_tokens_total")
    assert 0 < accepted <= drafted
    assert 0.0 <= metric(after, "dynspec_acceptance_estimate") <= 1.0      # the executor's a_1 estimate
    assert metric(after, "dynspec_probe_iterations_total") == 0              # a schedule never probes
    assert any(name == "dynspec_gc_pause_seconds_total" for name, _ in after)     # exported, from 0 up
    assert metric(after, "dynspec_gc_pause_seconds_total") >= metric(before, "dynspec_gc_pause_seconds_total") >= 0


@pytest.mark.slow
def test_16_concurrent_streams_match_the_reference_and_k_drops_to_0(server, info, oracle):
    texts, id_prompts = prompts(info, 8, 8)
    jobs = [dict(text=t) for t in texts] + [dict(prompt_ids=p) for p in id_prompts]
    prompt_ids = [tuple(info.tokenizer.encode(t)) for t in texts] + [tuple(p) for p in id_prompts]
    expected = oracle([(p, NEW_TOKENS, info.eos_ids) for p in prompt_ids])

    before = metrics(server)
    seen, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            m = metrics(server)
            seen.append((metric(m, "dynspec_batch_size"), metric(m, "dynspec_draft_length")))
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with ThreadPoolExecutor(len(jobs)) as pool:
            replies = list(pool.map(lambda kw: call(server, request(**kw)), jobs))
    finally:
        stop.set()
        poller.join()

    for i, (reply, want) in enumerate(zip(replies, expected)):
        assert reply.error is None, (i, reply.error)
        assert tuple(reply.ids) == want, i
        assert "".join(reply.texts) == info.decode(reply.ids), i
    after = settle(server, lambda m: metric(m, "dynspec_batch_size") == 0)
    assert metric(after, "dynspec_iterations_total", k="0") > metric(before, "dynspec_iterations_total", k="0")
    assert any(b > 4 and k == 0 for b, k in seen), seen
    assert max(b for b, _ in seen) <= MAX_BATCH
    finished = metric(after, "dynspec_requests_finished_total") - metric(before, "dynspec_requests_finished_total")
    assert finished == len(jobs)


@pytest.mark.slow
def test_non_streaming_request_and_end_id(server, info, oracle):
    prompt = prompts(info, 0, 1, seed=2)[1][0]
    full = oracle([(prompt, NEW_TOKENS, ())])[0]
    reply = call(server, request(prompt_ids=prompt, stream=False, end_id=-1))
    assert reply.error is None and reply.responses == 1 and tuple(reply.ids) == full
    assert reply.texts == [info.decode(full)]
    stop = full[5]
    reply = call(server, request(prompt_ids=prompt, stream=False, end_id=stop))
    assert tuple(reply.ids) == full[:full.index(stop) + 1]


@pytest.mark.slow
def test_bad_requests_get_clean_errors_and_the_server_keeps_serving(server, info, oracle):
    good = prompts(info, 0, 1, seed=3)[1][0]
    want = oracle([(good, 8, info.eos_ids)])[0]
    cases = [
        ("missing input", request(max_tokens=8), "neither 'text_input'"),
        ("missing max_tokens", request(prompt_ids=good, max_tokens=None), "max_tokens"),
        ("wrong dtype", [tensor("input_ids", [1.0, 2.0], np.float32), tensor("max_tokens", [8], np.int32)],
         "input_ids"),
        ("prompt longer than the cache", request(prompt_ids=[5] * MAX_SEQ_LEN, max_tokens=8),
         f"exceeds the cache length max_seq_len={MAX_SEQ_LEN}"),
        ("max_tokens 0", request(prompt_ids=good, max_tokens=0), "max_tokens=0 must be at least 1"),
        ("max_tokens < 0", request(prompt_ids=good, max_tokens=-2), "max_tokens=-2 must be at least 1"),
        ("non-UTF-8 bytes", request(text=b"caf\xe9 au lait", max_tokens=8), "not valid UTF-8: byte 0xe9 at offset 3"),
        ("token id outside the vocabulary", request(prompt_ids=[1, info.vocab_size], max_tokens=8),
         "outside the vocabulary"),
    ]
    for what, inputs, message in cases:
        bad = call(server, inputs, timeout=30)
        assert bad.error is not None and message in bad.error, (what, bad)
        ok = call(server, request(prompt_ids=good, max_tokens=8), timeout=60)
        assert ok.error is None and tuple(ok.ids) == want, (what, ok)
    assert server.proc.poll() is None


@pytest.mark.slow
def test_cancelled_request_frees_its_slot(server, info):
    import tritonclient.grpc as grpcclient

    before = metrics(server)
    prompt = prompts(info, 0, 1, seed=4)[1][0]
    long = MAX_SEQ_LEN - len(prompt) - SCHEDULE.max_draft_len - 1
    client = grpcclient.InferenceServerClient(server.grpc_url)
    q = queue.Queue()
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer(MODEL, request(prompt_ids=prompt, max_tokens=long, end_id=-1))
    result, error = q.get(timeout=60)
    assert error is None and len(result.as_numpy("output_ids")) > 0
    client.stop_stream(cancel_requests=True)
    client.close()

    after = settle(server, lambda m: metric(m, "dynspec_requests_finished_total", reason="cancelled")
                   > metric(before, "dynspec_requests_finished_total", reason="cancelled")
                   and metric(m, "dynspec_batch_size") == 0)
    assert metric(after, "dynspec_requests_finished_total", reason="cancelled") == \
        metric(before, "dynspec_requests_finished_total", reason="cancelled") + 1
    assert metric(after, "dynspec_requests_finished_total", reason="length") == \
        metric(before, "dynspec_requests_finished_total", reason="length")
    assert metric(after, "dynspec_batch_size") == 0
    reply = call(server, request(prompt_ids=prompt, max_tokens=4))
    assert reply.error is None and len(reply.ids) == 4


def http_generate(server, body):
    """POST /v2/models/dynspec/generate -> (HTTP status, JSON reply)."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://{server.http_url}/v2/models/{MODEL}/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_genai_perf_tensorrtllm_request(server, info, oracle):
    """What genai-perf 0.0.16 sends with `--endpoint-type kserve --backend tensorrtllm --streaming
    --output-tokens-mean N --output-tokens-mean-deterministic`, literally: its TensorRTLLMConverter
    (genai_perf/inputs/converters/tensorrtllm_converter.py) writes, per prompt,
        {"model": M, "text_input": [text], "max_tokens": [256], "exclude_input_in_output": [True]}
    then `stream: [True]`, and with a requested output length N `max_tokens: [N]` and `min_length: [N]`.
    perf_analyzer picks the model by "model" and sends the rest as inputs with the types that the
    model's config declares, over one gRPC stream."""
    text, n = "def read_config(path):", 24
    want = oracle([(tuple(info.tokenizer.encode(text)), n, info.eos_ids)])[0]
    stops_early = len(want) < n
    inputs = [tensor("text_input", [text.encode()], np.object_), tensor("max_tokens", [n], np.int32),
              tensor("exclude_input_in_output", [True], np.bool_), tensor("stream", [True], np.bool_),
              tensor("min_length", [n], np.int32)]
    reply = call(server, inputs)
    if stops_early:                      # greedy decoding ends before n: min_length cannot be honoured
        assert reply.error is not None and f"min_length={n}" in reply.error
    else:
        assert reply.error is None, reply.error
        assert tuple(reply.ids) == want and "".join(reply.texts) == info.decode(want)
    # the same request without streaming, and over HTTP generate (genai-perf's JSON, less "model")
    status, body = http_generate(server, {"text_input": [text], "max_tokens": [n], "exclude_input_in_output": [True],
                                          "min_length": [n]})
    assert (status == 400) == stops_early and (stops_early or tuple(body["output_ids"]) == want), body


@pytest.mark.slow
def test_options_are_honoured(server, info, oracle):
    prompt = prompts(info, 0, 1, seed=5)[1][0]
    full = oracle([(prompt, NEW_TOKENS, ())])[0]

    def options(stream=False, **extra):
        inputs = request(prompt_ids=prompt, stream=stream, end_id=-1)
        kinds = {bool: np.bool_, int: np.int32, float: np.float32, str: np.object_}
        for name, value in extra.items():
            values = value if isinstance(value, list) else [value]
            values = [v.encode() if isinstance(v, str) else v for v in values]
            inputs.append(tensor(name, values, kinds[type(value[0] if isinstance(value, list) else value)]))
        return inputs

    # exclude_input_in_output=false: the prompt comes first, in ids and in text, streamed or not
    for stream in (False, True):
        reply = call(server, options(stream=stream, exclude_input_in_output=False))
        assert reply.error is None and tuple(reply.ids) == tuple(prompt) + full
        assert "".join(reply.texts) == info.decode(tuple(prompt) + full)
    # a stop word: a token of the output whose text encodes back to it alone; the output ends after it
    pos = next(i for i in range(3, len(full)) if info.encode_words(info.decode([full[i]])) == [full[i]])
    word = info.decode([full[pos]])
    cut = full.index(full[pos])
    for stream in (False, True):
        reply = call(server, options(stream=stream, stop_words=[word]))
        assert reply.error is None and tuple(reply.ids) == full[:cut + 1], (word, reply)
    # a bad word that greedy decoding produces: refused at that token, the streamed prefix is exact
    reply = call(server, options(stream=True, bad_words=[word]))
    assert reply.error is not None and f"produces {word!r} at output token {cut}" in reply.error
    assert tuple(reply.ids) == full[:cut]
    # min_length against end_id: refused while end_id would come too early, exact once it may
    end = full[6]
    first = full.index(end)
    reply = call(server, request(prompt_ids=prompt, stream=False, end_id=end) + [tensor("min_length", [first + 1],
                                                                                          np.int32)])
    assert reply.error is not None and f"reaches end_id {end} after {first} tokens" in reply.error
    reply = call(server, request(prompt_ids=prompt, stream=False, end_id=end) + [tensor("min_length", [first],
                                                                                          np.int32)])
    assert reply.error is None and tuple(reply.ids) == full[:first + 1]
    # inputs that change nothing in greedy decoding
    reply = call(server, options(pad_id=0, length_penalty=2.0, top_k=1, temperature=0.5))
    assert reply.error is None and tuple(reply.ids) == full


@pytest.mark.slow
def test_what_greedy_decoding_cannot_give_is_refused_over_grpc_and_http(server, info):
    prompt = prompts(info, 0, 1, seed=6)[1][0]
    cases = [("temperature", 0.7, np.float32, "temperature=0.7 is not supported"),
             ("top_k", 40, np.int32, "top_k=40 asks for sampling"),
             ("top_p", 0.9, np.float32, "top_p=0.9 asks for sampling"),
             ("beam_width", 2, np.int32, "beam_width=2 is not supported"),
             ("return_log_probs", True, np.bool_, "return_log_probs=true is not supported")]
    for name, value, dtype, message in cases:
        reply = call(server, request(prompt_ids=prompt, max_tokens=4) + [tensor(name, [value], dtype)], timeout=30)
        assert reply.error is not None and message in reply.error, (name, reply)
        status, body = http_generate(server, {"input_ids": prompt, "max_tokens": 4, name: value})
        assert status == 400 and message in body["error"], (name, body)
    # a key that is no input reaches the model as a request parameter over HTTP: refused, not dropped
    status, body = http_generate(server, {"input_ids": prompt, "max_tokens": 4, "ignore_eos": True})
    assert status == 400 and "unsupported request parameter(s) 'ignore_eos'" in body["error"]
    status, body = http_generate(server, {"input_ids": prompt, "max_tokens": 4})
    assert status == 200 and len(body["output_ids"]) == 4
    assert server.proc.poll() is None


def consistent(counts: dict, n_ids: int) -> None:
    """A final response's counts: all four, accepted <= drafted, mean_k in [0, K max] and equal to
    drafted / decode_steps (FP32), and no more tokens than the iterations can have emitted."""
    assert set(counts) == set(ACCEPTANCE_OUTPUTS), counts
    assert 0 <= counts["accepted_drafts"] <= counts["drafted"] and counts["decode_steps"] >= 1, counts
    assert 0.0 <= counts["mean_k"] <= SCHEDULE.max_draft_len, counts
    assert counts["mean_k"] == pytest.approx(counts["drafted"] / counts["decode_steps"], rel=1e-6), counts
    assert n_ids <= 1 + counts["decode_steps"] + counts["accepted_drafts"], (counts, n_ids)


@pytest.mark.slow
def test_responses_report_their_requests_acceptance_and_metrics_histogram_it(server, info, oracle):
    """Each answered request's final response (gRPC, streamed or not) and HTTP generate reply carry
    its counts; a lone request's equal the offline executor's for it (the same steps at K=4); the
    /metrics histograms grow by exactly the answered requests, bucket by bucket."""
    families = ("dynspec_request_acceptance", "dynspec_request_mean_k")
    before = {f: histogram(server.metrics(), f) for f in families}
    texts, id_prompts = prompts(info, 0, 7, seed=7)
    lone = id_prompts[0]
    reply = call(server, request(prompt_ids=lone))
    assert reply.error is None and reply.early_counts == 0 and reply.responses >= 2
    oracle([(lone, NEW_TOKENS, info.eos_ids)])
    want = oracle.results[0]
    assert reply.counts == {"accepted_drafts": want.accepted_drafts, "drafted": want.drafted,
                            "decode_steps": want.decode_steps, "mean_k": pytest.approx(want.mean_k, rel=1e-6)}
    assert want.drafted > 0
    answered = [reply.counts]
    # six at once, half streamed (batch 6 > 4: K drops to 0 for a while), then one over HTTP generate
    jobs = [dict(prompt_ids=p, stream=i % 2 == 0) for i, p in enumerate(id_prompts[1:])]
    with ThreadPoolExecutor(len(jobs)) as pool:
        replies = list(pool.map(lambda kw: call(server, request(**kw)), jobs))
    for r in replies:
        assert r.error is None and r.early_counts == 0, r
        consistent(r.counts, len(r.ids))
        answered.append(r.counts)
    status, body = http_generate(server, {"input_ids": lone, "max_tokens": NEW_TOKENS})
    assert status == 200 and body["output_ids"] == list(want.output_ids), body
    assert {k: body[k] for k in ("accepted_drafts", "drafted", "decode_steps")} == \
        {k: reply.counts[k] for k in ("accepted_drafts", "drafted", "decode_steps")}
    assert body["mean_k"] == want.mean_k and body["acceptance"] == want.acceptance
    answered.append({k: body[k] for k in ACCEPTANCE_OUTPUTS})

    acceptance = [c["accepted_drafts"] / c["drafted"] for c in answered if c["drafted"]]
    mean_k = [c["drafted"] / c["decode_steps"] for c in answered if c["decode_steps"]]
    # observed just before the final response is sent: read until the last one is in
    deadline = time.monotonic() + 10
    while True:
        after = {f: histogram(server.metrics(), f) for f in families}
        grew = after["dynspec_request_mean_k"].count - before["dynspec_request_mean_k"].count
        if grew >= len(mean_k) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    a, b = after["dynspec_request_acceptance"], before["dynspec_request_acceptance"]
    assert a.count - b.count == len(acceptance) and a.sum - b.sum == pytest.approx(sum(acceptance), abs=1e-9)
    assert delta(a, b) == expected_buckets(acceptance, ACCEPTANCE_BUCKETS)
    m, mb = after["dynspec_request_mean_k"], before["dynspec_request_mean_k"]
    assert m.count - mb.count == len(mean_k) and m.sum - mb.sum == pytest.approx(sum(mean_k), abs=1e-9)
    assert delta(m, mb) == expected_buckets(mean_k, mean_k_buckets(SCHEDULE.max_draft_len))
    # a bad request afterwards is answered and observes nothing; the server keeps serving
    bad = call(server, request(prompt_ids=[1, info.vocab_size], max_tokens=4), timeout=30)
    assert bad.error is not None and bad.counts == {}
    ok = call(server, request(prompt_ids=lone, max_tokens=4))
    assert ok.error is None and len(ok.ids) == 4
    consistent(ok.counts, 4)
