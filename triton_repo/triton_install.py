"""Find and configure the `tritonserver` that the nvidia-pytriton wheel ships (CPU works): its
binary, a backend directory, its environment and its command line.

What the wheel needs, worked out once here:
  - binary   pytriton/tritonserver/bin/tritonserver; its libraries lie in nvidia_pytriton.libs
  - python backend  pytriton/tritonserver/backends/python/{libtriton_python.so, *_utils.py}; the
    stub is per Python version (python_backend_stubs/3.X/) and must sit next to the backend, so
    each launch assembles a private --backend-directory
  - the stub embeds libpython: LD_LIBRARY_PATH gets this interpreter's LIBDIR so the same
    CPython build is loaded, and PATH starts with this environment's bin/ so the embedded
    interpreter finds the venv (pyvenv.cfg) and its site-packages, where dynspec is installed.
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import sysconfig
import uuid
from dataclasses import dataclass
from pathlib import Path

from dynspec.errors import DynspecError
from dynspec.triton_repo.ports import Ports


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    libs: Path                 # bundled shared libraries (nvidia_pytriton.libs)
    python_backend: Path       # folder with libtriton_python.so + triton_python_backend_utils.py
    stub: Path                 # triton_python_backend_stub for this Python version


def find_tritonserver() -> TritonInstall:
    """Locate the tritonserver binary and python backend inside the installed nvidia-pytriton."""
    try:
        import pytriton
    except ImportError as e:
        raise DynspecError("nvidia-pytriton is not installed; `pip install nvidia-pytriton` ships tritonserver") from e
    root = Path(pytriton.__file__).resolve().parent / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    install = TritonInstall(
        binary=root / "bin" / "tritonserver",
        libs=root.parent.parent / "nvidia_pytriton.libs",
        python_backend=root / "backends" / "python",
        stub=root / "python_backend_stubs" / version / "triton_python_backend_stub",
    )
    for name, path in (("binary", install.binary), ("python backend", install.python_backend / "libtriton_python.so"),
                       (f"python {version} backend stub", install.stub)):
        if not path.exists():
            raise DynspecError(f"tritonserver {name} not found at {path} (nvidia-pytriton {root})")
    return install


def backend_dir(install: TritonInstall, dst: str | os.PathLike) -> Path:
    """A --backend-directory with the python backend and this Python's stub side by side."""
    py = Path(dst) / "python"
    py.mkdir(parents=True, exist_ok=True)
    for f in install.python_backend.iterdir():
        if f.is_file():
            shutil.copy2(f, py / f.name)
    shutil.copy2(install.stub, py / "triton_python_backend_stub")
    return Path(dst)


def server_env(install: TritonInstall, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (libdir, str(install.libs), env.get("LD_LIBRARY_PATH")) if p)
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.prefix) / "bin"), env.get("PATH")) if p)
    return env


def shm_prefix() -> str:
    """A python-backend shm-region-prefix-name unique to one launch: dynspec_<pid>_<8 hex>_"""
    return f"dynspec_{os.getpid()}_{uuid.uuid4().hex[:8]}_"


ADMIN_APIS = "model-repository,trace,logging"    # tritonserver's APIs that need the admin key
ADMIN_HEADER = "dynspec-admin-key"              # its header on the HTTP front
# gRPC metadata keys arrive in lower case (HTTP/2), so a restriction on a key with capitals is one
# no gRPC client can meet: tritonserver's admin protocols are closed over gRPC, and the flag holds no secret
GRPC_CLOSED = f"--grpc-restricted-protocol={ADMIN_APIS}:Closed-Over-gRPC=closed"
STACK_BYTES = 64 << 20                          # tritonserver's RLIMIT_STACK (server_process._child_setup)


def admin_key() -> str:
    """A fresh admin key (256 bits, URL-safe): one per launcher, kept over restarts, never on a
    command line (the HTTP front checks it)."""
    return secrets.token_urlsafe(32)


def grpc_address(host: str) -> str:
    """--grpc-address for `host`: tritonserver joins it to the port with a colon, so an IPv6
    address needs brackets. '::1' -> '[::1]'."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def metrics_address(host: str) -> str:
    """--metrics-address for `host`: its HTTP library takes IPv6 as 'ipv6:ADDR' (a bare '::1'
    binds 255.255.255.255). '::1' -> 'ipv6:::1'."""
    return f"ipv6:{host.strip('[]')}" if ":" in host else host


def server_command(install: TritonInstall, repo: str | os.PathLike, ports: Ports, backends: str | os.PathLike,
                   host: str = "127.0.0.1", exit_timeout_s: int = 5, shm_prefix: str = "dynspec_",
                   http_socket: str | os.PathLike | None = None) -> list[str]:
    """http_socket: the Unix socket tritonserver's own HTTP service listens on (behind the HTTP
    front, in the launch's private folder); None: TCP on host:ports.http. tritonserver's admin
    protocols are closed over gRPC (GRPC_CLOSED); over HTTP the front checks the admin key.
    No pinned memory pool: on a machine without a CUDA driver, asking for one logs a driver error."""
    http = [f"--http-address=unix:{http_socket}", "--http-port=0"] if http_socket else \
        [f"--http-address={metrics_address(host)}", f"--http-port={ports.http}"]
    return [
        str(install.binary),
        f"--model-repository={Path(repo).resolve()}",
        f"--backend-directory={backends}",
        f"--backend-config=python,shm-region-prefix-name={shm_prefix}",
        *http,
        f"--grpc-address={grpc_address(host)}", f"--grpc-port={ports.grpc}",
        f"--metrics-address={metrics_address(host)}", f"--metrics-port={ports.metrics}",
        "--allow-metrics=true", "--allow-gpu-metrics=false", "--pinned-memory-pool-byte-size=0",
        f"--exit-timeout-secs={exit_timeout_s}",
        GRPC_CLOSED,
    ]
