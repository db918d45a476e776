"""Run a command that sees its own ``/etc/hosts``: real multi-address names on loopback.

``unshare --mount`` gives the command a private mount namespace in which
temporary files are bind-mounted over ``/etc/hosts`` (the names to resolve),
``/etc/host.conf`` (``multi on``, so glibc returns every address of a name)
and ``/etc/resolv.conf`` (a closed loopback port, so no DNS query leaves the
machine). ``--uts`` can give it a host name too, as a container has. The
machine's own files are never touched, and rewriting the hosts file in place
(same inode) changes what the running command resolves next: that is how the
tests make actors join and leave.

Import as ``from hosts_namespace import HostsNamespace`` (``tests/`` is on ``sys.path``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence

__all__ = ["HostsNamespace"]

_SCRIPT = r"""
set -eu
mount --bind "$1" /etc/hosts
mount --bind "$2" /etc/host.conf
mount --bind "$3" /etc/resolv.conf
if [ -n "$4" ]; then hostname "$4"; fi
shift 4
exec "$@"
"""


class HostsNamespace:
    """A hosts table, and the argv prefix that runs a command against it.

    Args:
        workdir: A directory for the files (a test's ``tmp_path``).
        names: ``{name: [ip, ...]}``; ``localhost`` -> 127.0.0.1 is always added.
        hostname: The command's host name (needs ``--uts``); None keeps the machine's.
    """

    def __init__(
        self, workdir: pathlib.Path, names: Mapping[str, Sequence[str]], hostname: str | None = None
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.hosts = workdir / "hosts"
        self._host_conf = workdir / "host.conf"
        self._resolv = workdir / "resolv.conf"
        self.hostname = hostname
        self._host_conf.write_text("multi on\n")
        self._resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        self.hosts.touch()
        self.update(names)

    def update(self, names: Mapping[str, Sequence[str]]) -> None:
        """Rewrite the table in place; a running command sees it on its next lookup."""
        lines = ["127.0.0.1 localhost"]
        lines += [f"{ip} {name}" for name, ips in names.items() for ip in ips]
        with self.hosts.open("r+") as handle:  # same inode: the bind mount follows it
            handle.truncate(0)
            handle.write("\n".join(lines) + "\n")

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """The argv that runs ``argv`` inside the namespace."""
        flags = ["--mount", "--propagation", "private"] + (["--uts"] if self.hostname else [])
        return [
            "unshare",
            *flags,
            "sh",
            "-c",
            _SCRIPT,
            "sh",
            str(self.hosts),
            str(self._host_conf),
            str(self._resolv),
            self.hostname or "",
            *argv,
        ]
