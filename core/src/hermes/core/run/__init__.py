"""Running: the worker, the process pool, the scheduler and heartbeats.

A :class:`~hermes.core.Worker` owns one run of a consumer and a dispatcher;
the pool supervises worker processes; the scheduler emits periodic jobs;
heartbeats say who is alive. It imports the layers below, never the CLI.
"""
