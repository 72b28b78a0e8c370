"""The embedded tiny trained pair: EAGLE-3 wiring is real (acceptance that wrong capture
layers or a wrong d2t destroy), and keep-warm lets speculation resume at full acceptance.
Every prompt is drawn from the held-out files build_info.json records, never training text."""
import json
import sysconfig

import pytest
import torch

from dynspec import corpus
from dynspec.corpus import default_prompts
from dynspec.runtime.generate.generate_setup import _tokenizer
from dynspec.runtime.serving.driver import run_closed_loop
from dynspec.runtime.engines.reference.engine import ReferenceEngine
from dynspec.runtime.engines.reference.load import load_draft, load_target
from dynspec.runtime.serving.executor import Executor
from dynspec.runtime.policy import DraftSchedule
from dynspec.runtime.generate.session import tiny_pair_dirs

K = 4


@pytest.fixture(scope="module")
def tiny():
    target, draft = tiny_pair_dirs()
    return target, draft, default_prompts(_tokenizer(target), n=16, length=48)


def test_held_out_split_is_the_recorded_one(tmp_path, monkeypatch):
    """Another interpreter's module list must not move files between train and held-out:
    a new stdlib module that sorts first shifts a recomputed every-8th split entirely."""
    info = json.loads((corpus.ASSET_DIR / "build_info.json").read_text())
    train, held = corpus.stdlib_files()
    assert [f.name for f in held] == [n for n in info["held_out_files"] if (corpus.stdlib_root() / n).is_file()]
    assert not {f.name for f in held} & set(info["train_files"])
    fake = tmp_path / "stdlib"
    fake.mkdir()
    for name in ["_aaa_new_module.py"] + info["train_files"] + info["held_out_files"]:
        (fake / name).write_text(f"# {name}\n")
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"stdlib": str(fake)})
    assert [f.name for f in corpus.stdlib_files()[1]] == info["held_out_files"]


def test_default_prompts_are_held_out_text(tiny):
    """Each prompt decodes to text found in a held-out file and in no training file."""
    tok = _tokenizer(tiny[0])
    train, held = corpus.stdlib_files()
    held_text, train_text = corpus.read_texts(held), corpus.read_texts(train)
    prompts = tiny[2]
    assert len(prompts) == 16 and len(set(prompts)) == 16 and all(len(p) == 48 for p in prompts)
    for p in prompts:
        text = tok.decode(list(p))
        assert any(text in t for t in held_text), text
        assert not any(text in t for t in train_text), text


def make_engine(tiny, capture=None, scramble_d2t=False, max_batch=16):
    target = load_target(tiny[0])
    draft = load_draft(tiny[1], target, capture_layers=capture)
    if scramble_d2t:
        # a valid but wrong draft->target map: same set of target ids, permuted
        ids = torch.arange(draft.d2t.numel()) + draft.d2t
        perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))
        draft.d2t.copy_(ids[perm] - torch.arange(ids.numel()))
    return ReferenceEngine(target, draft, max_batch_size=max_batch, max_seq_len=256, max_draft_len=K)


def mean_accepted(engine, prompts, n=48) -> float:
    """Accepted draft tokens per row per speculative step."""
    ex = Executor(engine, DraftSchedule.static(K, 64))
    run_closed_loop(ex, prompts, n, concurrency=8)
    return sum(s.accepted for s in ex.stats) / sum(s.batch_size for s in ex.stats if s.k)


def test_eagle3_wiring_is_real(tiny):
    good = mean_accepted(make_engine(tiny), tiny[2])
    layers = make_engine(tiny).draft.capture_layers
    wrong_layers = tuple(reversed(layers)) if len(set(layers)) > 1 else layers
    bad_layers = mean_accepted(make_engine(tiny, capture=wrong_layers), tiny[2])
    bad_d2t = mean_accepted(make_engine(tiny, scramble_d2t=True), tiny[2])
    print(f"\nmean accepted drafts/step at K={K}: wired {good:.2f}, capture {wrong_layers} {bad_layers:.2f},"
          f" scrambled d2t {bad_d2t:.2f}")
    assert good > 1.5
    assert bad_layers < 1.5 and bad_layers < 0.6 * good
    assert bad_d2t < 1.5 and bad_d2t < 0.6 * good


class PhasePolicy:
    """Test-only policy driven by the iteration count (concurrency 1): K for `spec_first`
    iterations, 0 for `pause`, then K again. The product policy is a pure function of b."""

    max_draft_len, drafts, chooses_keep_warm = K, True, False      # runtime/policy/__init__.py Policy

    def __init__(self, spec_first: int, pause: int):
        self.i, self.a, self.b = 0, spec_first, spec_first + pause

    def __call__(self, b: int) -> int:
        self.i += 1
        return 0 if self.a < self.i <= self.b else K

    def choices(self, batch_size: int) -> tuple[int, ...]:
        return (0, K)

    def decide(self, x):
        from dynspec.runtime.policy.step_decision import one_k

        return one_k(self(x.batch_size), x)


def _resume_window(tiny, prompts, keep_warm: bool | None, n=160, spec_first=6, pause=30):
    """Per request: (start position, accepted) of every speculative step after the pause,
    or of every step for an uninterrupted run (keep_warm=None)."""
    engine = make_engine(tiny, max_batch=1)
    steps = []
    for p in prompts:
        policy = DraftSchedule.static(K, 1) if keep_warm is None else PhasePolicy(spec_first, pause)
        ex = Executor(engine, policy, keep_warm=bool(keep_warm) if keep_warm is not None else True)
        run_closed_loop(ex, [p], n, concurrency=1)
        pos, paused, rows = 1, False, []
        for s in ex.stats:
            paused = paused or s.k == 0
            if s.k and (paused or keep_warm is None):
                rows.append((pos, s.accepted))
            pos += s.emitted
        steps.append(rows)
    return steps


def test_keep_warm_resumes_at_full_acceptance(tiny):
    """Greedy outputs are the same in every run (lossless), so the steps after the pause can be
    compared with the uninterrupted run's steps over the same token positions."""
    prompts = tiny[2][:8]
    ref = _resume_window(tiny, prompts, None)
    warm = _resume_window(tiny, prompts, True)
    cold = _resume_window(tiny, prompts, False)

    def acc(windows, starts, first_only=None):
        vals = []
        for rows, start in zip(windows, starts):
            sel = [a for p, a in rows if p >= start]
            vals += sel[:first_only] if first_only else sel
        return sum(vals) / max(1, len(vals))

    starts = [rows[0][0] for rows in warm]
    a_ref, a_warm, a_cold = acc(ref, starts), acc(warm, starts), acc(cold, starts)
    a_ref5, a_warm5, a_cold5 = acc(ref, starts, 5), acc(warm, starts, 5), acc(cold, starts, 5)
    print(f"\nafter a 30-iteration K=0 pause: uninterrupted {a_ref:.2f}, keep-warm {a_warm:.2f},"
          f" keep-warm off {a_cold:.2f} accepted/step (first 5 steps: {a_ref5:.2f} / {a_warm5:.2f} / {a_cold5:.2f})")
    assert abs(a_warm - a_ref) <= 0.10 * a_ref
    assert abs(a_warm5 - a_ref5) <= 0.10 * a_ref5 + 0.05
