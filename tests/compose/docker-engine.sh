#!/usr/bin/env bash
# Makes sure a Docker engine answers and compose is there: starts dockerd where none runs, installing Debian's
# docker.io, docker-compose and debootstrap when root and apt are there. Exits non-zero with the reason otherwise.
# The daemon it starts makes no default bridge and touches no firewall or forwarding: containers reach only the
# networks compose makes, and those the tests mark internal.
set -euo pipefail
docker info >/dev/null 2>&1 && command -v debootstrap >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "no Docker engine answers, and without root and apt-get none can be installed here"; exit 1
fi
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || docker compose version >/dev/null 2>&1 || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null || { echo "apt-get could not install ${missing[*]}"; exit 1; }
fi
if ! docker info >/dev/null 2>&1; then
    mkdir -p /etc/docker
    [ -f /etc/docker/daemon.json ] || \
        echo '{"bridge": "none", "iptables": false, "ip-forward": false, "ip-masq": false}' >/etc/docker/daemon.json
    setsid dockerd >/var/log/zerobubble-dockerd.log 2>&1 < /dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start: $(tail -3 /var/log/zerobubble-dockerd.log)"; exit 1; }
fi
