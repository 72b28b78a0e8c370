"""Hugging Face checkpoint folders, read and written in one place for `dynspec convert` and the
reference engine alike (neither imports the other), one module per job; a broken rule is a
DynspecError naming the file (and the tensor):
    folder_files      files inside the folder (no link or path leaves it), their JSON, stamps
                      that tell a weight file rewritten while it is read
    hf_config         config.json, its fields type-checked (config_fields)
    weight_index      which file holds each tensor (safetensors index or headers, .bin index)
    safetensors_file  a safetensors header, and tensors (or a TP rank's slice) read without mmap
    pytorch_bin       a pytorch_model.bin state dict (torch.load(weights_only=True))
    tensor_reader     tensors by name, each checked (no float8, no NaN/Inf) as it is read
    writer            safetensors shards + index
    eagle3            what a public EAGLE-3 draft's config and tensors mean: capture layers, name
                      aliases, d2t/t2d
    shapes            a Llama-family shape from its config, and its sizes per tensor-parallel rank
    tp_checks         whether TP at tp ranks is feasible for a shape (convert, build and the
                      reference engine's TP sharding ask the same rules)"""
