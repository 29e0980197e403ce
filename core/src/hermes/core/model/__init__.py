"""The message model: :class:`Message`, its serializer and the error tree.

The lowest layer: it imports nothing else of Hermes. Every other layer may
import it. Public names are re-exported by :mod:`hermes.core` and
:mod:`hermes.core.drivertools`; import those, not these private modules.
"""
