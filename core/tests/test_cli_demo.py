"""``hermes demo`` tells the whole story on a temporary queue, with no server.

The queue is a temporary file:// directory, or memory:// where hermes-core is the only
distribution installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERMES = shutil.which("hermes", path=str(Path(sys.executable).parent)) or shutil.which("hermes")
#: The demo promises to finish in under a minute; a hang fails here instead of hanging CI.
DEMO_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    """One run of ``hermes demo`` through the console script, shared by the tests below."""
    assert HERMES is not None, "the hermes console script is not installed"
    cwd = tmp_path_factory.mktemp("demo")
    environ = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    return subprocess.run(
        [HERMES, "demo"],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )


def test_the_demo_succeeds_on_a_temporary_file_queue_without_a_server(
    demo: subprocess.CompletedProcess[str],
) -> None:
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert demo.stderr == ""
    queue = re.search(r"^Queue: (file://\S+) \(FileSystemDriver", demo.stdout, re.MULTILINE)
    assert queue, demo.stdout
    assert not Path(queue.group(1).removeprefix("file://")).exists(), "temporary queue left behind"


def test_the_demo_handles_the_batch_highest_priority_first(
    demo: subprocess.CompletedProcess[str],
) -> None:
    started = re.findall(r"worker  Start handle message #(order-\d) \(order.paid\) priority:(\d+)",
                         demo.stdout)  # fmt: skip
    assert started == [
        ("order-2", "200"),
        ("order-5", "200"),
        ("order-3", "100"),
        ("order-6", "100"),
        ("order-1", "50"),
        ("order-4", "50"),
    ]
    assert "highest priority first, FIFO within a priority on this queue" in demo.stdout


def test_the_demo_says_the_order_within_a_priority_is_the_driver_s(
    demo: subprocess.CompletedProcess[str],
) -> None:
    text = " ".join(demo.stdout.split())
    assert "first in first out within one on this file:// queue" in text
    assert "a Redis set keeps no order within a priority" in text


def test_the_readme_says_on_its_main_page_that_redis_keeps_no_order_within_a_priority() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    guarantees = readme[readme.index("## Delivery guarantees") :]
    guarantees = " ".join(guarantees[: guarantees.index("\n## ", 3)].split()).lower()
    assert "order within a priority" in guarantees
    assert "redis sets are unordered" in guarantees


def test_the_demo_retries_the_failing_handler_with_the_backoff_and_says_it_fast_forwards(
    demo: subprocess.CompletedProcess[str],
) -> None:
    backoffs = re.findall(
        r"#invoice-1 retry (\d): backoff for retries=(\d) \((\d+)\.\.(\d+) s\) is "
        r"(\d+\.\d) s -> execute_at \d\d:\d\d:\d\d\.\d{3}$",
        demo.stdout,
        re.MULTILINE,
    )
    assert [(n, r, low, high) for n, r, low, high, _ in backoffs] == [
        ("1", "0", "16", "45"),
        ("2", "1", "18", "76"),
    ]
    for _, _, low, high, seconds in backoffs:
        assert int(low) <= float(seconds) <= int(high)
    assert demo.stdout.count("demo fast-forward /20: copy sent with execute_at") == 2
    assert "a real worker would wait the full" in demo.stdout
    assert (
        len(re.findall(r"worker  ERROR Handler InvoiceMailer throws exception", demo.stdout)) == 2
    )
    assert "invoice-1 attempt 3: invoice sent" in demo.stdout


def test_the_demo_holds_the_delayed_message_until_its_time(
    demo: subprocess.CompletedProcess[str],
) -> None:
    assert re.search(r"emit    #report-1 \(report.daily\) priority:100, execute_at", demo.stdout)
    ran = re.search(r"handler report-1 ran \d+\.\d{3} s (after|BEFORE) its execute_at", demo.stdout)
    assert ran and ran.group(1) == "after", demo.stdout


def test_the_demo_ends_with_a_summary_of_the_dispatcher_counts(
    demo: subprocess.CompletedProcess[str],
) -> None:
    summary = demo.stdout.split("\nSummary (", 1)[1]
    assert "invoice-1: 3 attempts" in summary
    assert "Dispatcher.stats: received 10, handled 8, failed 2, retried 2" in summary
    assert "NOTICE Exiting hermes dispatcher - shutdown" in demo.stdout


def test_the_commands_the_demo_suggests_work_as_printed(
    demo: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    suggested = demo.stdout.split("\nYour turn", 1)[1].splitlines()[1:]
    commands = [line.strip() for line in suggested if line.strip()]
    assert commands[-1].startswith("hermes worker")
    assert HERMES is not None
    environ = {k: v for k, v in os.environ.items() if k != "HERMES_URL"}
    environ["PATH"] = f"{Path(HERMES).parent}{os.pathsep}{environ.get('PATH', '')}"

    result = subprocess.run(
        ["bash", "-e", "-c", "\n".join(commands)],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert 'Payload: {"amount": 10}' in result.stdout
    assert result.stdout.splitlines()[-1].endswith(
        "received 1, handled 1, failed 0, retried 0, gave up 0"
    )


def test_with_hermes_core_alone_the_demo_runs_on_memory_and_says_what_to_install(
    tmp_path: Path, core_only_env: dict[str, str]
) -> None:
    assert HERMES is not None
    result = subprocess.run(
        [sys.executable, "-S", HERMES, "demo"],
        cwd=tmp_path,
        env=core_only_env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^Queue: memory://hermes-demo-\S+ \(MemoryDriver", result.stdout, re.M)
    assert "hermes-filesystem is not installed" in result.stdout
    assert "Dispatcher.stats: received 10, handled 8, failed 2, retried 2" in result.stdout
    your_turn = result.stdout.split("\nYour turn", 1)[1]
    assert "\n  pip install hermes-filesystem" in your_turn
