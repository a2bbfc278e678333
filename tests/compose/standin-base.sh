#!/usr/bin/env bash
# Makes a stand-in for python:3.11-slim where no registry can be reached: Debian bookworm (whose python3 is 3.11)
# from Debian's own packages, imported under the tag the Dockerfile names. The root file system is cached in
# ${ZB_CACHE:-/var/cache/zerobubble}, so later runs only import it. Usage: standin-base.sh TAG
set -euo pipefail
tag="$1"
# A new import is a new image, which would make every build after it start from scratch.
docker image inspect "$tag" >/dev/null 2>&1 && exit 0
cache="${ZB_CACHE:-/var/cache/zerobubble}"
tarball="$cache/bookworm-python3.tar"
mkdir -p "$cache"
if [ ! -s "$tarball" ]; then
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    # bubblewrap and wget too: the image's sandbox and the Prometheus stand-in's health check need them.
    debootstrap --variant=minbase --include=python3,python3-venv,bubblewrap,wget,ca-certificates \
        bookworm "$root" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
fi
docker import --change 'CMD ["/bin/bash"]' "$tarball" "$tag" >/dev/null
