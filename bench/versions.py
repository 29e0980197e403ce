"""``hermes worker`` of two installs, interleaved in one run: did a change cost throughput?

    python -m bench.versions --other /path/to/other/.venv/bin/hermes [--rounds 5] [-n 5000]
    python -m bench.versions --other-args=--no-heartbeat --name heartbeat --only redis
    python -m bench.versions --other /tmp/old/bin/hermes --other-script --other-label 601512e

The third form runs the other install's own ``hermes`` script, for a Hermes
older than ``bench.hermes_cli`` (its environment must hold no observer plugin).

The second form compares one install with itself, run two ways: ``--args``
and ``--other-args`` add ``hermes worker`` options to each side, and
``--observe`` / ``--other-observe`` let one observer plugin through
(bench.hermes_cli), so a heartbeat or a plugin is measured the same steady
way as a version.

Each round fills a fresh queue and times this environment's ``hermes worker``
draining it, then the other install's, on the same broker and job (which one
goes first alternates per round); each row is the median of its rounds, and
the ratio is this install's rate over the other's. The jobs are bench.jobs's
(``noop``, ``incr``), imported by both workers from this checkout, so the only
thing that differs is the Hermes each ``hermes`` command imports. Both run
through ``bench.hermes_cli`` with every observer plugin blocked, so a plugin
installed in one environment only (hermes-opentelemetry, hermes-sentry) does
not count against it.

Beside the rate, each row gives the worker's CPU time per message (its
``time.process_time()`` from the first job to the last, over the messages
between): on a shared machine whose load moves, the rate of one sample swings
by a fifth, while the CPU a message costs the worker moves less, so the CPU
ratio (the other's over this one's, above 1 when this one is cheaper) is the
steadier answer to "did it get slower". Written to
``bench/results/versions.md`` (and ``.json``) unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench.run import (
    ROOT,
    Env,
    HermesSetting,
    fill,
    load_average,
    machine,
    purge_and_close,
    rate,
    wait_result,
    worker,
)

sys.path.insert(0, str(ROOT / "tools"))
import services

from hermes.core import connect

#: (row label, broker, URL options): the settings both installs understand.
SETTINGS = [
    ("redis", "redis", ""),
    ("redis at-least-once", "redis", "delivery=at-least-once"),
    ("filesystem fsync=false", "filesystem", "fsync=false"),
    ("rabbitmq prefetch=1", "rabbitmq", "prefetch=1"),
]
JOBS = ("noop", "incr")


def base_url(broker: str, tmp: Path) -> str:
    if broker == "redis":
        return services.ensure_redis()
    if broker == "rabbitmq":
        return services.ensure_rabbitmq()
    return f"file://{tmp / 'queue'}"


def one(
    command: list[str], url: str, job: str, n: int, env: Env, extra: Sequence[str] = ()
) -> tuple[float, float]:
    """Fill ``url`` with ``n`` messages; the rate at which ``command worker`` drains it
    and the worker's CPU microseconds per message."""
    driver = connect(url)
    try:
        fill(driver, n)
        with tempfile.TemporaryDirectory() as tmp:
            out, log = Path(tmp) / "result.json", Path(tmp) / "worker.log"
            argv = [*command, "worker", "--url", url, "--handlers", "bench.jobs:register"]
            argv += ["--max-items", str(n), *extra]
            with worker(argv, env.make(n, out, job), log) as proc:
                result = wait_result(out, proc, 600, log)
                return rate(result), result["cpu_s"] * 1e6 / max(result["count"] - 1, 1)
    finally:
        purge_and_close(driver)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--other", default="", help="the other install's hermes command (default: this one)"
    )
    parser.add_argument("--args", default="", help="hermes worker options for this side")
    parser.add_argument("--other-args", default="", help="hermes worker options for the other")
    parser.add_argument("--observe", default="", help="an observer plugin to let through here")
    parser.add_argument("--other-observe", default="", help="the same for the other side")
    parser.add_argument(
        "--other-script",
        action="store_true",
        help="run the other install's hermes script as it is, not through bench.hermes_cli: "
        "for a Hermes older than the launcher (its environment must hold no observer plugin)",
    )
    parser.add_argument(
        "--name", default="versions", help="output file name: bench/results/NAME.md and .json"
    )
    parser.add_argument("--other-label", default="before", help="its name in the table")
    parser.add_argument("--label", default="after", help="this install's name in the table")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=5_000, help="messages per sample")
    parser.add_argument("--only", default="", help="comma-separated row labels")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    env = Env(services.ensure_redis(), f"bench-incr-{uuid.uuid4().hex[:8]}")
    if args.label == args.other_label:
        parser.error(f"--label and --other-label are both {args.label!r}")
    other_python = str(Path(args.other).with_name("python")) if args.other else sys.executable
    if args.other_script and (not args.other or args.other_observe):
        parser.error("--other-script needs --other, and lets no observer through")

    def launcher(python: str, observe: str) -> list[str]:
        return [python, "-m", "bench.hermes_cli", *(["--observe", observe] if observe else [])]

    commands = {
        args.label: launcher(sys.executable, args.observe),
        args.other_label: (
            [args.other] if args.other_script else launcher(other_python, args.other_observe)
        ),
    }
    extras = {args.label: shlex.split(args.args), args.other_label: shlex.split(args.other_args)}
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    loads = [load_average()]
    samples: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = list(commands) if round_ % 2 == 0 else list(reversed(commands))
            for label, broker, options in SETTINGS:
                if only and label not in only:
                    continue
                for job in JOBS:
                    for name in order:
                        url = HermesSetting(label, options).url(base_url(broker, Path(tmp)))
                        value, cpu_us = one(commands[name], url, job, args.n, env, extras[name])
                        samples.setdefault((label, job, name), []).append((value, cpu_us))
                        print(
                            f"round {round_ + 1} {label} {job} {name}: {value:,.0f} msgs/s, "
                            f"{cpu_us:.1f} us CPU/msg",
                            flush=True,
                        )
    loads.append(load_average())
    rows = []
    for label, _, _ in SETTINGS:
        for job in JOBS:
            mine = samples.get((label, job, args.label))
            theirs = samples.get((label, job, args.other_label))
            if not mine or not theirs:
                continue
            a = statistics.median(rate for rate, _ in mine)
            b = statistics.median(rate for rate, _ in theirs)
            cpu_a = statistics.median(cpu for _, cpu in mine)
            cpu_b = statistics.median(cpu for _, cpu in theirs)
            rows.append(
                {
                    "row": label,
                    "job": job,
                    args.label: a,
                    args.other_label: b,
                    "ratio": a / b,
                    f"{args.label} cpu_us": cpu_a,
                    f"{args.other_label} cpu_us": cpu_b,
                    "cpu_ratio": cpu_b / cpu_a,
                }
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started": started, "machine": machine(), "load": loads, "rounds": args.rounds}
    sides = {
        name: " ".join([*commands[name][1:], "worker", *extras[name]])
        if len(commands[name]) > 1
        else " ".join(["hermes", "worker", *extras[name]])
        for name in commands
    }
    meta["commands"] = sides
    report = {**meta, "n": args.n, "rows": rows}
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    lines = [
        f"`python -m bench.versions` ({started}, {meta['machine']}, load {' -> '.join(loads)}): "
        f"`hermes worker` two ways, interleaved, {args.n:,} messages per sample, "
        f"median of {args.rounds} rounds.",
        "",
        *(
            f"- {name}: `{side}` ({'this install' if name == args.label else other_python})"
            for name, side in sides.items()
        ),
        "",
        f"| setting | job | {args.label} msgs/s | {args.other_label} msgs/s | ratio "
        f"| {args.label} CPU µs/msg | {args.other_label} CPU µs/msg | CPU ratio |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['row']} | {row['job']} | {row[args.label]:,.0f} | "
            f"{row[args.other_label]:,.0f} | {row['ratio']:.2f}x "
            f"| {row[f'{args.label} cpu_us']:.1f} | {row[f'{args.other_label} cpu_us']:.1f} "
            f"| {row['cpu_ratio']:.2f}x |"
        )
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
