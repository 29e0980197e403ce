"""A Hermes worker process for the benchmark: ``python -m bench.hermes_worker URL N``."""

from __future__ import annotations

import sys

from bench.jobs import NoopHandler
from hermes.core import Dispatcher, connect


def main() -> None:
    url, count = sys.argv[1], int(sys.argv[2])
    driver = connect(url)
    driver.set_max_process_items(count)
    dispatcher = Dispatcher(driver)
    dispatcher.register_handler("bench", NoopHandler())
    print("ready", flush=True)
    dispatcher.handle()
    driver.close()


if __name__ == "__main__":
    main()
