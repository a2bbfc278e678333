"""Finding the memory cgroup the sandbox's runs go under, on the layouts hosts and containers have."""

from pathlib import Path

import pytest

from zerobubble.common.sandbox.runner import find_memory_cgroup

HYBRID_V1 = (
    "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/dfc0\n1:cpu:/\n0::/\n",
    "50 40 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "53 40 0:33 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "59 40 0:39 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
)
SYSTEMD_V2 = (
    "0::/user.slice/user-0.slice/session-3.scope\n",
    "24 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
    "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
)
CONTAINER_V2 = (  # a private cgroup namespace: the container's cgroup is its root
    "0::/\n",
    "620 611 0:27 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n",
)
CONTAINER_V1 = (  # no cgroup namespace: the mount's root is the container's cgroup
    "4:memory:/docker/4f1e\n2:cpu,cpuacct:/docker/4f1e\n",
    "700 690 0:40 /docker/4f1e /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"
    "701 690 0:41 /docker/4f1e /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n",
)
NO_MEMORY = (
    "2:cpu,cpuacct:/\n",
    "701 690 0:41 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
)


@pytest.mark.parametrize(("layout", "expected"), [
    (HYBRID_V1, (Path("/sys/fs/cgroup/memory/process_api/dfc0"), 1)),
    (SYSTEMD_V2, (Path("/sys/fs/cgroup/user.slice/user-0.slice/session-3.scope"), 2)),
    (CONTAINER_V2, (Path("/sys/fs/cgroup"), 2)),
    (CONTAINER_V1, (Path("/sys/fs/cgroup/memory"), 1)),
    (NO_MEMORY, None),
], ids=["hybrid-v1", "systemd-v2", "container-v2", "container-v1", "no-memory-controller"])
def test_memory_cgroup_of_each_layout(layout, expected):
    assert find_memory_cgroup(*layout) == expected


def test_this_machine_has_one():
    found = find_memory_cgroup(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    assert found is not None and found[0].is_dir()
