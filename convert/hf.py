"""Tokenizer files that travel with a converted checkpoint. Reading config.json and weights is
dynspec.checkpoint.reader's job (shared with the reference engine)."""
from __future__ import annotations

import shutil
from pathlib import Path

from dynspec.checkpoint.reader import source_file

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
