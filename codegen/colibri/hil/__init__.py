"""Hardware in the loop: run a generated MoE layer on a board from a user's own pytest suite.

:mod:`colibri.hil.plugin` is a pytest plugin (registered through the ``pytest11`` entry point)
with the ``colibri_board`` fixture; :mod:`colibri.hil.backends` runs a firmware on a board with
one of four backends: ``qemu`` (the built-in runner, :func:`colibri.targets.qemu.run_elf`),
``labgrid`` (a labgrid environment whose target has a ``QEMUDriver``), ``farm`` (places of a
labgrid coordinator, each a QEMU board served over a network serial port by
:mod:`colibri.hil.farm`) and ``pyocd`` (a real Cortex-M board through a debug probe, semihosting
served by pyOCD). Every backend returns a :class:`~colibri.hil.core.HilResult`.
"""

from .core import Firmware, HilResult, load_firmware

__all__ = ["Firmware", "HilResult", "load_firmware"]
