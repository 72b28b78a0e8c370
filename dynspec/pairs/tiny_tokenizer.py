"""The tiny pair's byte-level BPE tokenizer: trained on the corpus text, saved so that
AutoTokenizer.from_pretrained(DIR/target) works, the text encoded into one token stream
(EOS between files), and random windows [n, length] cut from that stream."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

EOS = "<|endoftext|>"


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS)
    fast.save_pretrained(str(folder))


def encode_stream(tok, texts: list[str]) -> Tensor:
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: Tensor, n: int, length: int, g: torch.Generator) -> Tensor:
    starts = torch.randint(0, stream.numel() - length, (n,), generator=g)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])
