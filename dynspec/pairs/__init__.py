"""Test and benchmark model pairs, kept out of the serving code: `tiny_pair` builds (and checks)
the embedded tiny target + EAGLE-3 draft from `tiny_config` (its spec and HF configs),
`tiny_tokenizer`, `train_tiny_target` and `train_tiny_draft`; `tiny_check` measures its
acceptance with `decode` (plain and K-chain speculative greedy decoding, held-out prompts).
`random_pair` writes random-weight pairs of a real shape. The tiny pair's text (its recorded
train/held-out split and the prompts drawn from it) is dynspec/corpus.py, below runtime/, which
`dynspec generate` reads too."""
