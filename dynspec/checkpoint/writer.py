"""Write tensors as HF safetensors shards plus model.safetensors.index.json, streaming: a shard
is flushed once adding the next tensor would push it past max_shard_bytes.

    one shard  -> model.safetensors                                   + index
    3 shards   -> model-00001-of-00003.safetensors ... -00003-of-00003 + index
"""
from __future__ import annotations

import errno
import json
from pathlib import Path

from dynspec.checkpoint.weight_index import ST_INDEX
from dynspec.errors import DynspecError

DEFAULT_SHARD_BYTES = 5 * 10**9   # transformers' default max_shard_size "5GB"


class ShardWriter:
    def __init__(self, out: Path, max_shard_bytes: int = DEFAULT_SHARD_BYTES):
        if max_shard_bytes < 1:
            raise DynspecError(f"max_shard_bytes={max_shard_bytes} must be positive")
        self.out, self.max_shard_bytes = Path(out), max_shard_bytes
        self._pending: dict = {}
        self._pending_bytes = 0
        self._shards: list[tuple[Path, list[str]]] = []   # (temporary path, tensor names)
        self._names: set[str] = set()
        self.total_bytes = 0

    def add(self, name: str, tensor) -> None:
        if name in self._names:
            raise DynspecError(f"tensor {name!r} written twice")
        nbytes = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + nbytes > self.max_shard_bytes:
            self._flush()
        self._pending[name] = tensor.contiguous().cpu()
        self._names.add(name)
        self._pending_bytes += nbytes
        self.total_bytes += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.out / f".shard-{len(self._shards):05d}.safetensors"
        try:
            save_file(self._pending, str(path), metadata={"format": "pt"})
        except Exception as e:    # safetensors reports a full disk or `ulimit -f` as SafetensorError
            path.unlink(missing_ok=True)
            raise OSError(errno.EIO, str(e), str(path)) from None     # atomic_dir names the output
        self._shards.append((path, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> list[str]:
        """Flush, give shards their final names, write the index. Returns the shard file names."""
        if self._pending:
            self._flush()
        if not self._shards:
            raise DynspecError("no tensors were written")
        n = len(self._shards)
        names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        weight_map = {}
        for (tmp, keys), name in zip(self._shards, names):
            tmp.rename(self.out / name)
            weight_map.update({k: name for k in keys})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
        (self.out / ST_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        return names
