"""Virtual environments that hold what a user of one system installs.

For the rows where what else is installed shows: start-up and idle memory.
The benchmark's own environment holds every Hermes distribution, every peer
and the test tools. Importing redis-py there also imports the OpenTelemetry
SDK (redis-py loads it when it is installed), and every Hermes process loads
every installed plugin. A user of Hermes on RabbitMQ installs hermes-core and
hermes-rabbitmq; a user of Dramatiq on Redis, ``dramatiq[redis]``.

Each environment is made once under ``.nox/bench-envs/<name>`` (with uv when it
is there, else venv and pip), the Hermes distributions built from this
checkout and installed as wheels, as users install them (an editable install
puts a path entry per distribution on ``sys.path``, which every import then
searches), and its modules compiled to bytecode as ``pip install`` does; it is
made again when its requirements or those distributions' files change.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / ".nox" / "bench-envs"

#: Name -> what is installed in it (pip requirement arguments, paths from the root).
ENVS: dict[str, list[str]] = {
    **{
        f"hermes-{driver}": ["./core", f"./drivers/{driver}"]
        for driver in ("filesystem", "redis", "rabbitmq", "sqs", "kafka", "postgres")
    },
    # What a user who installs every observer and the dashboard has, configuring none.
    "hermes-redis-plugins": [
        "./core",
        "./drivers/redis",
        "./plugins/prometheus",
        "./plugins/opentelemetry",
        "./plugins/sentry",
        "./dashboard",
    ],
    "dramatiq-redis": ["dramatiq[redis]>=1.17"],
    "celery-redis": ["celery[redis]>=5.4"],
    # bench.async_io's asyncio peer.
    "arq-redis": ["arq>=0.26"],
}


def _uv() -> str | None:
    found = shutil.which("uv")
    local = ROOT / ".venv" / "bin" / "uv"
    return found or (str(local) if local.exists() else None)


def python(name: str) -> str:
    """The interpreter of environment ``name``, made (or brought up to date) first."""
    requirements = ENVS[name]
    path = HOME / name
    interpreter = path / "bin" / "python"
    stamp = path / "bench-requirements.txt"
    wanted = "\n".join([*requirements, sources_digest(tuple(requirements))])
    if not (interpreter.exists() and stamp.exists() and stamp.read_text() == wanted):
        shutil.rmtree(path, ignore_errors=True)
        subprocess.run([*new_venv(path), *requirements], cwd=ROOT, check=True)
        stamp.write_text(wanted)
    compile_bytecode(str(interpreter))
    return str(interpreter)


def new_venv(path: Path) -> list[str]:
    """A new virtual environment at ``path`` (with uv when it is there): its install command."""
    interpreter = path / "bin" / "python"
    uv = _uv()
    if uv:
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(path)], check=True)
        return [uv, "pip", "install", "-q", "--python", str(interpreter)]
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return [str(interpreter), "-m", "pip", "install", "-q"]


@functools.cache
def sources_digest(requirements: tuple[str, ...]) -> str:
    """A digest of the files of the requirements that are directories of this checkout.

    Installed as wheels, they are copies: an environment whose digest differs
    holds an older Hermes and is made again. Read once per run: the sources do
    not change while the benchmark runs, and every sample asks.
    """
    digest = hashlib.sha256()
    for requirement in requirements:
        path = ROOT / requirement
        if not path.is_dir():
            continue
        for file in sorted(path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts and "tests" not in file.parts:
                stat = file.stat()
                name = file.relative_to(ROOT)
                digest.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def compile_bytecode(interpreter: str) -> None:
    """Compile ``interpreter``'s site-packages and the repository's sources to bytecode."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    site = subprocess.run(
        [interpreter, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    paths = [site, str(ROOT / "bench")]
    paths += [str(p) for p in ROOT.glob("*/src")] + [str(p) for p in ROOT.glob("*/*/src")]
    subprocess.run(
        [interpreter, "-m", "compileall", "-q", "-j", "0", *paths],
        env=env,
        check=False,  # a module that does not compile (a test fixture) is not ours to time
        capture_output=True,
    )


def environ(base: dict[str, str]) -> dict[str, str]:
    """``base`` for a process of one of these environments: bytecode is read, not recompiled."""
    env = dict(base)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
