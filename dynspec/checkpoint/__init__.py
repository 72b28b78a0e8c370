"""Hugging Face checkpoint folders, read and written in one place for `dynspec convert` and the
reference engine alike (neither imports the other): `reader` (config.json, weights, the rules
every tensor passes), `writer` (safetensors shards + index), `eagle3` (what a public EAGLE-3
draft's config and tensors mean: capture layers, name aliases, d2t/t2d)."""
