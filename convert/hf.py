"""Tokenizer files that travel with a converted checkpoint. Reading config.json and weights is
dynspec.checkpoint.reader's job (shared with the reference engine)."""
from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
    "generation_config.json",
)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied
