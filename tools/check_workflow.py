"""Check that the CI workflow runs what ``./run test`` runs.

    python tools/check_workflow.py --targets memory redis ... --sessions tests lint ...

The conformance job's matrix must list exactly the noxfile's conformance
targets, and the workflow's ``./run test -s ...`` steps must name every other
session, so a driver or a session added to the noxfile cannot be left out of
CI unnoticed. actionlint checks the rest of the file (the lint session runs both).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "ci.yml"


def run_lines(workflow: dict[str, Any]) -> list[str]:
    """Every line of every ``run:`` step, in every job."""
    lines: list[str] = []
    for job in workflow.get("jobs", {}).values():
        for step in job.get("steps", []):
            lines += str(step.get("run", "")).splitlines()
    return lines


def sessions_run(lines: list[str], matrix: dict[str, list[str]]) -> set[str]:
    """The nox sessions named by ``./run test -s A B ...`` lines, matrix values filled in."""
    named: set[str] = set()
    for line in lines:
        match = re.search(r"\./run test -s (.+)", line)
        if match is None:
            continue
        for word in shlex.split(match.group(1)):
            if word == "--":
                break
            if "${TARGET}" in word:
                named.update(word.replace("${TARGET}", target) for target in matrix["target"])
            else:
                named.add(word)
    return named


def problems(workflow: dict[str, Any], targets: list[str], sessions: list[str]) -> list[str]:
    found: list[str] = []
    conformance = workflow.get("jobs", {}).get("conformance")
    if conformance is None:
        return ["there is no job named conformance"]
    matrix = conformance.get("strategy", {}).get("matrix", {})
    listed = [str(target) for target in matrix.get("target", [])]
    if listed != targets:
        found.append(
            f"the conformance matrix lists {listed}, the noxfile {targets}: "
            "make them the same, in the same order"
        )
    named = sessions_run(run_lines(workflow), {"target": listed})
    wanted = {f"conformance(target='{target}')" for target in targets} | set(sessions)
    for session in sorted(wanted - named):
        found.append(f"no step runs `./run test -s {session}`")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", required=True, help="the conformance targets")
    parser.add_argument("--sessions", nargs="+", required=True, help="every other session")
    parser.add_argument("--workflow", type=Path, default=WORKFLOW)
    args = parser.parse_args(argv)
    workflow = yaml.safe_load(args.workflow.read_text())
    found = problems(workflow, args.targets, args.sessions)
    for problem in found:
        print(f"{args.workflow.name}: {problem}", file=sys.stderr)
    if not found:
        print(
            f"{args.workflow.name}: runs all {len(args.targets)} conformance targets "
            f"and {', '.join(args.sessions)}"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
