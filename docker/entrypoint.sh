#!/bin/sh
# rlfleet's container entrypoint: settles RLFLEET_WORKER_ID, then execs the command.
#
# Docker Compose cannot give scaled replicas an ordinal they can read (it names
# them rlfleet-actor-1..N, but a container cannot see its own name), so the
# compose file sets RLFLEET_WORKER_ID=from-ip: the worker id becomes the low 16
# bits of the container's IPv4 address. Addresses are unique on a network, so
# the ids of a fleet are unique whenever its network is a /16 or smaller
# (Docker's default pools hand out /16 and /20 networks), and an id stays the
# same for the life of its container. Any other value is left to rlfleet-actor
# (a number is used as is); unset means the hostname's ordinal suffix, which a
# Kubernetes StatefulSet provides (pod actors-3 -> 3).
set -eu

if [ "${RLFLEET_WORKER_ID:-}" = "from-ip" ]; then
    # The container's own address, as `hostname -i` would print it (from /etc/hosts); empty
    # when the host name has no IPv4 address (no network, an IPv6-only one).
    ip="$(python -c 'import socket
try:
    print(socket.gethostbyname(socket.gethostname()))
except OSError:
    pass')"
    case "$ip" in
        *[!0-9.]* | "" | 127.*)
            echo "rlfleet-entrypoint: RLFLEET_WORKER_ID=from-ip but the hostname has no network" \
                 "IPv4 address (it resolves to '${ip:-none}'); set RLFLEET_WORKER_ID to a number" >&2
            exit 64
            ;;
    esac
    third="$(echo "$ip" | cut -d. -f3)"
    fourth="$(echo "$ip" | cut -d. -f4)"
    RLFLEET_WORKER_ID=$((third * 256 + fourth))
    export RLFLEET_WORKER_ID
fi

exec "$@"
