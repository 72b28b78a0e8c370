"""A Hugging Face checkpoint folder's config.json, read the same for every stage (`dynspec
convert`, the reference engine, the launchers): its fields are type-checked as read
(config_fields.check_config)."""
from __future__ import annotations

from pathlib import Path

from dynspec.checkpoint.config_fields import check_config
from dynspec.checkpoint.folder_files import read_json_file, source_file, source_folder
from dynspec.errors import DynspecError


def read_config(folder: str | Path, what: str = "checkpoint") -> dict:
    """FOLDER/config.json as a dict, its fields type-checked; `what` names the folder in errors."""
    folder = source_folder(folder, what)
    if not (folder / "config.json").exists() and not (folder / "config.json").is_symlink():
        raise DynspecError(f"{what} folder {folder} has no config.json")
    path = source_file(folder, "config.json", f"{what} folder {folder}")
    cfg = read_json_file(path)
    if not isinstance(cfg, dict):
        raise DynspecError(f"{path}: must hold a JSON object, not {type(cfg).__name__}")
    check_config(cfg, str(path))
    return cfg
