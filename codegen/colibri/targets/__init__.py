"""Stage 7, targets: generated C -> firmware on a board, run, measured.

``build`` drives SCons for a board, ``qemu`` runs an ELF natively, under qemu-user or
qemu-system and counts its instructions, ``lmrun`` holds the runners' file protocols
(MoE layer, whole transformer), ``size`` reports flash and RAM from the ELF, ``elfcheck`` proves
the MCU link has no heap, and ``binding`` loads the C runtime into Python (ctypes: a MoE block
from a file, a whole model from a version-2 container). ``lmrun`` also builds once per board and
runs the model-file runner of whole-model containers.
"""
