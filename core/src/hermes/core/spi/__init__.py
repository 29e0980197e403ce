"""The driver contract and what core keeps for drivers.

The :class:`Driver` and :class:`Consumer` contracts, capabilities and optional
protocols, URLs, the plugin registry, leases, per-process clients, shutdown
requests and the memory driver. It imports only :mod:`hermes.core.model`.
Driver authors import these names from :mod:`hermes.core.driver` (the contract)
and :mod:`hermes.core.drivertools` (core's helpers).
"""
