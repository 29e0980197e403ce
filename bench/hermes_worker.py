"""A bare Dispatcher for the benchmark: ``python -m bench.hermes_worker URL N``.

No CLI, no logging set up and no Shutdown to watch: the floor under what
``hermes worker`` adds.
"""

from __future__ import annotations

import sys

from bench.jobs import BenchHandler
from hermes.core import Dispatcher, connect


def main() -> None:
    url, count = sys.argv[1], int(sys.argv[2])
    driver = connect(url)
    driver.set_max_process_items(count)
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("bench", BenchHandler())
    print("ready", flush=True)
    dispatcher.handle()
    driver.close()


if __name__ == "__main__":
    main()
