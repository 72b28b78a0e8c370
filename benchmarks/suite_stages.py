"""Running a config's commands: each stage a subprocess in its own process group under one
deadline, its output installed where asked; and the engine a config needs, prepared once per
spec and work dir."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from dynspec.benchmarks.suite_checks import last_error_line, saved
from dynspec.benchmarks.suite_commands import prepare_commands
from dynspec.benchmarks.suite_paths import check_owned, private_work
from dynspec.benchmarks.suite_spec import COST_MODEL, STAGE_ENV, Config, EngineSpec, Stage, needs_cost_model
from dynspec.errors import DynspecError


def write_text_atomic(path: str | Path, text: str) -> None:
    """`text` to `path` by a temp file beside it, renamed."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


def install_file(src: str, dest: str) -> None:
    """Copy a stage's output to `dest` (the engine dir) atomically: a temp file beside it, renamed.
    The output must be a JSON object (a profile.json)."""
    from dynspec.artifacts import read_json

    read_json(src, "stage output to install")          # refuses what is not one JSON object
    d = Path(dest)
    tmp = d.with_name(f".{d.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, d)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class StageResult:
    name: str
    command: str
    rc: int
    wall_s: float
    timed_out: bool = False
    log: str = ""


def run_stage(stage: Stage, timeout_s: float, log: Path) -> StageResult:
    """Run one command, stdout+stderr to `log`; past `timeout_s` its process group is killed (rc 124)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **STAGE_ENV, **dict(stage.env))
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write("$ " + shlex.join(stage.argv) + "\n")
        f.flush()
        proc = subprocess.Popen(stage.argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc, timed_out = proc.wait(timeout=max(timeout_s, 0.001)), False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, timed_out = 124, True
    return StageResult(stage.name, shlex.join(stage.argv), rc, round(time.monotonic() - t0, 3), timed_out, log.name)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the stage's process group (mpirun and its ranks too), SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_stages(stages: Sequence[Stage], budget_s: float, logs: Path, bar=None,
               installed: list | None = None) -> tuple[list[StageResult], str | None]:
    """Run in order under one deadline; stop at the first failure. -> (results, None | why it stopped):
    "budget 540 s ran out in stage 'sweep' (killed after 531.2 s)", "stage 'sweep' failed with rc 2
    (log: logs/sweep.log): error: ..." (the log's last error line). Each install's destination as
    it was before is appended to `installed` (suite_checks.saved), for suite_checks.restore."""
    installed = [] if installed is None else installed
    deadline = time.monotonic() + budget_s
    done: list[StageResult] = []
    for st in stages:
        left = deadline - time.monotonic()
        if left <= 0:
            return done, f"budget {budget_s:g} s ran out before stage {st.name!r}"
        if bar is not None:
            bar.set_postfix_str(st.name)
        for d in st.dirs:
            Path(d).mkdir(parents=True, exist_ok=True)
        for path, text in st.files:
            write_text_atomic(path, text)
        r = run_stage(st, left, logs / f"{st.name}.log")
        done.append(r)
        if bar is not None:
            bar.update(1)
        if r.timed_out:
            return done, f"budget {budget_s:g} s ran out in stage {st.name!r} (killed after {r.wall_s:.1f} s)"
        if r.rc != 0:
            last = last_error_line(logs / f"{st.name}.log")
            return done, f"stage {st.name!r} failed with rc {r.rc} (log: {logs.name}/{st.name}.log)" + \
                (f": {last}" if last else "")
        if st.install:
            installed.append(saved(st.install))
            try:
                install_file(st.out, st.install)
            except (DynspecError, OSError) as e:
                return done, f"stage {st.name!r}: installing {st.out} as {st.install} failed: {e}"
    return done, None


def missing_cost_model(cfg: Config, engine_dir: Path | None) -> str | None:
    """Why the config cannot run: it reads ENGINE_DIR/cost_model.json, no stage of it installs one
    and the engine has none; None when it can."""
    need = needs_cost_model(cfg.stages)
    if not need or engine_dir is None or any(s.install == COST_MODEL for s in cfg.stages):
        return None
    path = Path(engine_dir) / COST_MODEL
    if path.is_file():
        return None
    return (f"stage(s) {need} read the engine's cost model {path}, which is absent: run the cost_model config"
            f" with the same --work first (python -m dynspec.benchmarks.suite cost_model --work {Path(engine_dir).parents[1]})")


def prepare(engine: EngineSpec, work: Path, logs: Path, dry_run: bool = False) -> dict:
    """-> {"engine_dir", "reused", "stages": [StageResult...]}; the tiny pair needs nothing. A
    work dir or engine another user owns is refused (check_engine), before anything is read."""
    if engine.pair == "tiny":
        return {"engine_dir": None, "reused": True, "stages": []}
    root = work / engine.key()
    marker = root / "prepared.json"
    info = {"engine_dir": str(root / "engine"), "reused": False, "stages": []}
    try:
        check_engine(engine, work)
    except DynspecError as e:
        raise StageFailure(f"prepare: {e}", info) from None
    if marker.is_file() and (root / "engine" / "engine.json").is_file():
        try:
            same = json.loads(marker.read_text()).get("spec") == engine.prepared()
        except ValueError:
            same = False
        if same:
            return dict(info, reused=True)
    cmds = prepare_commands(engine, root)
    if dry_run:
        return dict(info, commands=[shlex.join(c.argv) for c in cmds])
    marker.unlink(missing_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    results, why = run_stages(cmds, engine.prepare_budget_s, logs)
    info["stages"] = [asdict(r) for r in results]
    if why:
        raise StageFailure(f"prepare: {why}", info)
    marker.write_text(json.dumps({"spec": engine.prepared(), "commands": [r.command for r in results]}, indent=1))
    return info


def check_engine(engine: EngineSpec, work: Path) -> None:
    """Refuse WORK, WORK/<key>, its prepared.json or its engine when another user owns one; the
    default WORK is made private first (suite_paths.private_work)."""
    if engine.pair == "tiny":
        return
    private_work(work)
    root = work / engine.key()
    check_owned([work], "work dir")
    check_owned([root, root / "prepared.json", root / "engine", root / "engine" / "engine.json"], "prepared engine")


class StageFailure(DynspecError):
    def __init__(self, msg: str, info: dict):
        super().__init__(msg)
        self.info = info
