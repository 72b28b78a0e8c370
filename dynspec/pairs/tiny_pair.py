"""Build the tiny embedded target + EAGLE-3 draft pair from Python's own standard library.

    python -m dynspec.pairs.tiny_pair --out DIR [--seed 0] [--check]
    python -m dynspec.pairs.tiny_pair --check [DIR]   # default: the packaged pair

Every machine with Python has the text: the top-level `*.py` modules of the running
interpreter's standard library, sorted by name; every 8th one is held out for evaluation.
The split is recorded in build_info.json, and every measurement reads it from there (corpus.py).
The build (about 4 minutes on 2 CPU cores, fixed step counts, seeded):
1. a byte-level BPE tokenizer (`tokenizers`, vocab 1024), saved so that
   AutoTokenizer.from_pretrained(DIR/target) works;
2. a tiny Llama target (6 layers, hidden 128, GQA 4/2, llama3 RoPE scaling, untied head)
   trained with transformers' own LlamaForCausalLM, saved as bf16 safetensors;
3. self-distillation data: the bf16 target, loaded back through load_target, greedily
   continues prompts from the training text; every layer's output and its greedy tokens
   are kept;
4. an EAGLE-3 draft (capture layers (1, 3, 5), draft vocab = the 512 most frequent greedy
   tokens, so d2t matters) trained with a training-time-test unroll of K=4 chain steps:
   step 0 reads the target's fused capture, later steps read the draft's own previous
   output hidden, and the attention sees exactly what the cached chain sees at inference
   (see `_attend`). A second loss teaches it to abstain (uniform output) when it is fed the
   outputs of other layers or another order: a 6-layer toy's layers are far more alike
   than a real model's, and without it a wrongly wired capture would still be accepted.
`--check` runs a greedy K=4 chain-drafting loop with load_target/load_draft on held-out
prompts and prints the mean accepted draft tokens per step, also with wrong capture layers,
the right layers in the wrong order, and a scrambled d2t; it also checks that the output
equals plain greedy decoding. DIR/build_info.json records the spec, files and timing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, replace

import torch

from dynspec.corpus import ASSET_DIR, BUILD_INFO, read_texts, split_stdlib
from dynspec.pairs.decode import greedy_continue
from dynspec.pairs.tiny_check import check
from dynspec.pairs.tiny_config import TinySpec, draft_hf_config
from dynspec.pairs.tiny_tokenizer import encode_stream, save_tokenizer, train_tokenizer, windows
from dynspec.pairs.train_tiny_draft import capture_and_label, save_hf_draft, train_draft
from dynspec.pairs.train_tiny_target import save_hf_target, train_target
from dynspec.runtime.engines.reference.load import load_target


def build(out: str | os.PathLike, spec: TinySpec = TinySpec(), progress: bool = True) -> dict:
    """Write OUT/target and OUT/draft (and OUT/build_info.json); returns the build info."""
    from dynspec.artifacts import atomic_dir

    t0 = time.time()
    torch.manual_seed(spec.seed)
    train_files, held_files = split_stdlib()
    texts = read_texts(train_files)
    tok = train_tokenizer(texts, spec.vocab)
    vocab = tok.get_vocab_size()
    stream = encode_stream(tok, texts)
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if progress else (lambda *a: None)
    log(f"tokenizer: vocab {vocab}, {stream.numel()} training tokens from {len(train_files)} files "
        f"({time.time() - t0:.0f}s)")
    with atomic_dir(out, force=True) as tmp:
        hf_target = train_target(spec, stream, vocab, progress)
        save_hf_target(hf_target, tmp / "target")
        save_tokenizer(tok, tmp / "target")
        target = load_target(tmp / "target")                 # the bf16-rounded weights, as served
        g = torch.Generator().manual_seed(spec.seed + 3)
        prompts = windows(stream, spec.prompts, spec.prompt_len, g)
        seqs = greedy_continue(target, prompts, spec.seq_len - spec.prompt_len)
        L = target.config.num_layers
        captures, labels = capture_and_label(target, seqs, tuple(range(L)))
        captures = captures.unflatten(-1, (L, -1)).to(torch.bfloat16)             # [N, T, L, h]
        counts = torch.bincount(labels.flatten(), minlength=vocab).double()
        counts += torch.bincount(stream, minlength=vocab).double() / stream.numel()  # tie-break: corpus
        draft_ids = counts.argsort(descending=True, stable=True)[:spec.draft_vocab].sort().values
        coverage = float(torch.isin(labels, draft_ids).float().mean())
        log(f"distillation: {tuple(seqs.shape)} tokens, draft vocab {spec.draft_vocab} covers "
            f"{coverage:.1%} of greedy labels ({time.time() - t0:.0f}s)")
        draft = train_draft(spec, target, captures, seqs, labels, draft_ids, progress)
        save_hf_draft(draft, draft_hf_config(spec, target.config, spec.draft_vocab), tmp / "draft")
        info = {
            "built_by": "python -m dynspec.pairs.tiny_pair --out DIR",
            "spec": asdict(spec),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "train_files": [f.name for f in train_files],
            "held_out_files": [f.name for f in held_files],
            "train_tokens": int(stream.numel()),
            "draft_vocab_label_coverage": round(coverage, 4),
            "build_seconds": round(time.time() - t0, 1),
        }
        (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    log(f"built {out} in {info['build_seconds']}s")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dynspec.pairs.tiny_pair", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="build the pair into this folder (replaced if it exists)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", nargs="?", const="", default=None, metavar="DIR",
                    help="measure acceptance of DIR (default: --out, else the packaged pair)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.out is None and args.check is None:
        ap.error("nothing to do: pass --out DIR and/or --check [DIR]")
    if args.out:
        build(args.out, replace(TinySpec(), seed=args.seed), progress=not args.quiet)
    if args.check is not None:
        folder = args.check or args.out or ASSET_DIR
        print(json.dumps(check(folder, progress=not args.quiet), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
