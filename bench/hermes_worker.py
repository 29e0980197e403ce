"""A bare Dispatcher for the benchmark: ``python -m bench.hermes_worker URL N``.

No CLI, no logging set up and no Shutdown to watch: the floor under what
``hermes worker`` adds.
"""

from __future__ import annotations

import sys

from bench.jobs import BenchHandler
from hermes.core import Dispatcher, Worker, connect


def main() -> None:
    url, count = sys.argv[1], int(sys.argv[2])
    driver = connect(url)
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("bench", BenchHandler())
    print("ready", flush=True)
    Worker(driver, dispatcher, max_items=count).run()
    driver.close()


if __name__ == "__main__":
    main()
