"""The ``hermes`` command's subcommands; :mod:`hermes.core.cli` wires them to argparse."""
