"""The sandbox's seccomp filter, as the compiled classic BPF that bubblewrap's --seccomp loads: it refuses the
kernel keyring calls (add_key, request_key, keyctl) with EPERM, and every call of another ABI than the machine's own
(i386 through int 0x80, x32). Keyrings are not namespaced: a key a program adds to its uid's keyring would outlive
it and be read by the next program of the same slot, as Docker's default profile also refuses them."""

from __future__ import annotations

import errno
import os
import struct

# The ABI's audit arch and its add_key, request_key and keyctl numbers (linux/audit.h, the syscall tables).
_KEYRING_CALLS = {"x86_64": (0xC000003E, (248, 249, 250)), "aarch64": (0xC00000B7, (217, 218, 219))}
_X32_BIT = 0x40000000  # x32 calls are x86_64's arch with this bit set in the number
_LD_W_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_ARCH, _NR = 4, 0  # offsets in struct seccomp_data


def keyring_filter(machine: str | None = None) -> bytes | None:
    """The filter for `machine` (this one's by default), or None where its numbers are not known here."""
    known = _KEYRING_CALLS.get(machine or os.uname().machine)
    if known is None:
        return None
    arch, calls = known
    deny = 5 + len(calls)  # the last instruction's index: after the four below, the calls' and ALLOW
    program = [(_LD_W_ABS, 0, 0, _ARCH),
               (_JEQ, 0, deny - 2, arch),          # another ABI: refused
               (_LD_W_ABS, 0, 0, _NR),
               (_JGE, deny - 4, 0, _X32_BIT)]
    for call in calls:
        program.append((_JEQ, deny - (len(program) + 1), 0, call))
    program += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | errno.EPERM)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
