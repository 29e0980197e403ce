"""Instructions per message, counted by Valgrind: what a change costs, free of the machine's noise.

    python -m bench.instructions --python LABEL=/path/to/venv/bin/python [--python ...] [--out DIR]

A shared two-core machine moves a throughput row by a fifth from one sample to
the next, more than most changes to the per-message path cost. The machine
instructions a message costs do not move: each ``--python`` (a Hermes install,
e.g. a virtualenv with an older commit's hermes-core installed) runs the same
workload under ``valgrind --tool=callgrind``, which counts every instruction the
process executes, twice -- with ``SMALL`` and with ``LARGE`` messages -- and the
difference over ``LARGE - SMALL`` messages is the cost of one message, start-up
and shutdown cancelled out.

Three rows per install, each on the in-memory driver (no broker, no system calls
in the way) with one no-op handler:

- ``emit``: ``Emitter.emit_batch`` of the messages alone;
- ``worker``: emitting them, then a ``Worker`` (one thread, as ``hermes worker``
  runs by default) handling them, minus the ``emit`` row;
- ``dispatch``: ``Dispatcher.handle_message`` called directly on each message
  (the handlers' side of ``worker``), minus building the messages.

Instructions are not time (a cache miss or a system call costs more than its
count says), and the rows leave out the broker; ``bench.versions`` measures
``hermes worker`` against real brokers. This answers the narrower question
exactly: did the Python that runs per message grow. Written to
``bench/results/instructions.md`` (and ``.json``) unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.run import ROOT, machine

SMALL, LARGE = 1_000, 6_000

#: Run by each install's interpreter: ``WORKLOAD MODE N`` with MODE emit, worker,
#: dispatch or build. Only names every Hermes 6 has (connect, Emitter, Dispatcher,
#: Worker, Message), so older commits run it unchanged.
WORKLOAD = """
import sys
from hermes.core import Dispatcher, Emitter, Message, Worker, connect

class Noop:
    def handle(self, message):
        return True

mode, n = sys.argv[1], int(sys.argv[2])
messages = [Message("noop", {"i": i}) for i in range(n)]
if mode == "dispatch":
    dispatcher = Dispatcher(connect("memory://")).register_handler("noop", Noop())
    for message in messages:
        dispatcher.handle_message(message, 100)
elif mode in ("emit", "worker"):
    driver = connect("memory://")
    Emitter(driver).emit_batch(messages)
    if mode == "worker":
        dispatcher = Dispatcher(driver).register_handler("noop", Noop())
        Worker(driver, dispatcher, max_items=n, handle_signals=False).run()
"""

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def count(python: str, script: Path, mode: str, n: int) -> int:
    """Instructions the whole process ran for ``mode`` over ``n`` messages."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
             python, str(script), mode, str(n)],
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"bench.instructions: {python} {mode} {n} failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_message(python: str, script: Path, mode: str) -> float:
    return (count(python, script, mode, LARGE) - count(python, script, mode, SMALL)) / (
        LARGE - SMALL
    )


def measure(python: str, script: Path) -> dict[str, float]:
    # Compiled once first (even with PYTHONDONTWRITEBYTECODE set where the bench
    # is run), so no count includes compiling Hermes.
    subprocess.run(
        [python, "-c", "import compileall, hermes.core, os; "
         "compileall.compile_dir(os.path.dirname(hermes.core.__file__), quiet=1)"],
        check=True,
    )  # fmt: skip
    emit = per_message(python, script, "emit")
    build = per_message(python, script, "build")
    return {
        "emit": emit,
        "worker": per_message(python, script, "worker") - emit,
        "dispatch": per_message(python, script, "dispatch") - build,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--python",
        action="append",
        required=True,
        metavar="LABEL=PATH",
        help="an install to measure: its label and its interpreter (the first is the baseline)",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("bench.instructions: valgrind is not installed (apt-get install valgrind)",
              file=sys.stderr)  # fmt: skip
        return 2
    installs = []
    for item in args.python:
        label, sep, path = item.partition("=")
        if not sep or not label or not Path(path).exists():
            print(f"bench.instructions: --python {item!r}: give LABEL=PATH to an interpreter",
                  file=sys.stderr)  # fmt: skip
            return 2
        installs.append((label, path))
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        for label, python in installs:
            rows[label] = measure(python, script)
            print(label, {k: round(v) for k, v in rows[label].items()}, flush=True)
    base = installs[0][0]
    lines = [
        f"`python -m bench.instructions` ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
        f"{machine()}): instructions per message counted by Valgrind's callgrind, "
        f"({LARGE:,} - {SMALL:,} messages), in-memory driver, one no-op handler. "
        f"Ratios are {base}'s count over each install's (above 1: cheaper than {base}).",
        "",
        f"| install | emit | worker | dispatch | worker vs {base} | dispatch vs {base} |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, _ in installs:
        row = rows[label]
        lines.append(
            f"| {label} | {row['emit']:,.0f} | {row['worker']:,.0f} | {row['dispatch']:,.0f} "
            f"| {rows[base]['worker'] / row['worker']:.2f}x "
            f"| {rows[base]['dispatch'] / row['dispatch']:.2f}x |"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "instructions.md").write_text("\n".join(lines) + "\n")
    data = {"installs": installs, "rows": rows}
    (out / "instructions.json").write_text(json.dumps(data, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
