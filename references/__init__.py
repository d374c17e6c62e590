"""Float64 oracles, one module per operator family.

Each oracle is written from the maths in ``shared/design/OPS.md`` with NumPy or
torch on the CPU, never from a kernel and never with tilelang, so that a
kernel and its oracle cannot share a mistake.  Oracles are called like every
implementation, ``oracle(**case.inputs, **case.params)``.
"""
