"""Tokenizer files that travel with a converted checkpoint. Reading config.json and weights is
dynspec.checkpoint's job (shared with the reference engine)."""
from __future__ import annotations

import shutil
from pathlib import Path

from dynspec.checkpoint.config_fields import check_eos
from dynspec.checkpoint.folder_files import read_json_file, source_file
from dynspec.errors import DynspecError

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the TOKENIZER_FILES that src holds, as regular files; one that is a link leading
    outside src (or not a regular file) is refused, naming it."""
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).exists() or (src / name).is_symlink():
            shutil.copyfile(source_file(src, name, f"folder {src}"), dst / name)
            copied.append(name)
    return copied


def check_generation_config(src: Path, vocab: int) -> None:
    """src/generation_config.json, when present, is a JSON object whose eos_token_id (it wins over
    config.json's at serving time) is null, an int or a list of ints in [0, vocab)."""
    name = "generation_config.json"
    if not (src / name).exists() and not (src / name).is_symlink():
        return
    path = source_file(src, name, f"folder {src}")
    gen = read_json_file(path)
    if not isinstance(gen, dict):
        raise DynspecError(f"{path}: must hold a JSON object, not {type(gen).__name__}")
    check_eos(gen.get("eos_token_id"), vocab, str(path))
