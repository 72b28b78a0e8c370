"""What a Triton TP launch is (triton_repo/launch.py): TpLaunch, what the launcher tells TP rank 0 in
the python stub through its environment, and RepoLaunch, a checked launch of a repository. Below
launch.py and tp_ranks.py alike, so the ranks read it without importing the launcher:

    TpLaunch("127.0.0.1:29500", 2, "/e", "cpu", 0, 3.0, 90.0).env()["DYNSPEC_TP_SIZE"] == "2"
    TpLaunch.from_env({}) is None                 # a plain server.py launch
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from dynspec.errors import DynspecError

ENV_ENDPOINT = "DYNSPEC_TP_ENDPOINT"            # addr:port of the launcher's rendezvous store
ENV_SIZE = "DYNSPEC_TP_SIZE"                    # N
ENV_JOIN = "DYNSPEC_TP_JOIN_TIMEOUT_S"          # how long the ranks wait for each other to arrive and load
ENV_LOCAL_RANK = "DYNSPEC_TP_LOCAL_RANK"        # launcher's local rank on its host: places device 'cuda'
ENV_ENGINE_DIR = "DYNSPEC_TP_ENGINE_DIR"        # what the workers load; the stub's config.pbtxt must agree
ENV_DEVICE = "DYNSPEC_TP_DEVICE"


@dataclass(frozen=True)
class TpLaunch:
    """What the launcher tells TP rank 0 in the python stub, through its environment."""
    endpoint: str
    tp: int
    engine_dir: str
    device: str
    local_rank: int
    timeout_s: float
    join_timeout_s: float

    def env(self) -> dict[str, str]:
        from dynspec.runtime.tp.tp_layout import TIMEOUT_ENV

        return {ENV_ENDPOINT: self.endpoint, ENV_SIZE: str(self.tp), ENV_ENGINE_DIR: self.engine_dir,
                ENV_DEVICE: self.device, ENV_LOCAL_RANK: str(self.local_rank), TIMEOUT_ENV: repr(self.timeout_s),
                ENV_JOIN: repr(self.join_timeout_s)}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "TpLaunch | None":
        """None without DYNSPEC_TP_ENDPOINT (a plain `server.py` launch); a bad value is an error naming it."""
        from dynspec.runtime.tp.tp_groups import parse_endpoint
        from dynspec.runtime.tp.tp_layout import TIMEOUT_ENV

        if ENV_ENDPOINT not in env:
            return None
        missing = [k for k in (ENV_SIZE, ENV_ENGINE_DIR, ENV_DEVICE, ENV_LOCAL_RANK, TIMEOUT_ENV, ENV_JOIN)
                   if k not in env]
        if missing:
            raise DynspecError(f"{ENV_ENDPOINT} is set but {', '.join(missing)} is not: start the server "
                               "through `python -m dynspec.triton_repo.launch`")
        parse_endpoint(env[ENV_ENDPOINT])

        def number(name: str, kind, low):
            try:
                v = kind(env[name])
            except ValueError:
                v = None
            if v is None or not v >= low:
                raise DynspecError(f"environment variable {name}={env[name]!r} must be a number >= {low}")
            return v

        return cls(env[ENV_ENDPOINT], number(ENV_SIZE, int, 1), env[ENV_ENGINE_DIR], env[ENV_DEVICE],
                   number(ENV_LOCAL_RANK, int, 0), number(TIMEOUT_ENV, float, 1e-3), number(ENV_JOIN, float, 1e-3))

    def check_model(self, engine_dir: str, device: str) -> None:
        """The stub's config.pbtxt parameters must name what the workers load."""
        same = {"engine_dir": Path(engine_dir).resolve() == Path(self.engine_dir).resolve(),
                "device": device == self.device}
        for name, mine, theirs in (("engine_dir", engine_dir, self.engine_dir), ("device", device, self.device)):
            if not same[name]:
                raise DynspecError(f"config.pbtxt parameter {name}={mine!r}, but the launcher's workers load "
                                   f"{name}={theirs!r} (from dynspec_repo.json); regenerate the repository with "
                                   "`dynspec triton` instead of editing one of them")


@dataclass(frozen=True)
class RepoLaunch:
    """A checked launch of REPO at --tp N."""
    engine_dir: str
    device: str
    tp: int
