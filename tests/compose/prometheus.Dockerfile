# A stand-in for the prom/prometheus image where no registry can be reached: Debian's prometheus package on the
# stand-in base (standin-base.sh), started the way prom/prometheus starts (flags only in the compose command).
ARG BASE
FROM ${BASE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/bin/prometheus"]
