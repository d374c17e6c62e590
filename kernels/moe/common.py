"""What the MoE kernel modules share: the limits on experts and slots, the warp size, the pass
configs of the kernels that guard their own accesses, and ceiling division on the host."""

MAX_EXPERTS = 1024
MAX_K = 32
WARP = 32
# Every global access is guarded by hand (see the package docstring).
PASS_CONFIGS = {"tl.disable_safe_memory_legalize": True}


def _ceildiv(a: int, b: int) -> int:
    return -(-a // b)
