"""Settings both sides share: collection knobs, size limits and gRPC channel options.

The collection knobs carry TorchRL's names and meanings (see ``Collector``);
the learner sends them in a session's ``open`` message and the actor validates
them. The keepalive options are a matched pair: a client that pings more often
than the server allows is answered with GOAWAY ``too_many_pings`` and its
healthy streams die, so both sides take them from here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import ipaddress
import numbers
import operator
import re
from typing import TYPE_CHECKING, Any

from common.llm._settings import LLMSettings

if TYPE_CHECKING:
    import torch

__all__ = [
    "CHUNK_BYTES",
    "DEFAULT_PORT",
    "LEARNER_ID_METADATA",
    "MAX_CREDITS",
    "MAX_FRAMES_PER_BATCH",
    "MAX_LEARNER_ID",
    "MAX_MESSAGE_BYTES",
    "MAX_MODEL_ID",
    "MAX_TOKEN",
    "MODEL_ID_RE",
    "MAX_NUM_ENVS",
    "MAX_POLICY_VERSION",
    "MAX_SEED",
    "MAX_TIMEOUT_S",
    "MAX_WIRE_LEARNER_ID",
    "MAX_WORKER_ID",
    "MIN_PEER_PROTOCOL",
    "PROTOCOL_VERSION",
    "RELAY_PUSH_ID_BYTES",
    "RELAY_TICKET_BYTES",
    "TAKE_OVER_METADATA",
    "COMPILE_BACKENDS",
    "COMPILE_MODES",
    "WILDCARD_HOSTS",
    "CollectSettings",
    "CompileSettings",
    "ExplorationType",
    "check_actor_address",
    "check_device_name",
    "check_learner_id",
    "check_no_env_settings",
    "local_device",
    "same_device",
    "check_model_id",
    "check_seed",
    "check_token",
    "client_channel_options",
    "host_port",
    "is_loopback",
    "is_relay_address",
    "positive_timeout",
    "protocol_mismatch",
    "server_channel_options",
]

#: The wire protocol's revision this build speaks (``DescribeResponse`` and ``OpenSession``
#: carry it). Raise it with every change to ``protos/`` that a peer could misread; a field
#: a peer may ignore without harm (a new Describe report) needs none.
PROTOCOL_VERSION = 1
#: The oldest peer revision this build works with: raise it to ``PROTOCOL_VERSION`` when
#: a change leaves older peers misreading this build's messages, or this build theirs.
MIN_PEER_PROTOCOL = 1


def protocol_mismatch(peer: str, version: int, min_peer: int) -> str:
    """Why this build cannot work with ``peer``; "" when it can.

    Args:
        peer: Who, for the message (``"actor 10.0.0.1:50051"``).
        version: The protocol revision the peer speaks (0: a build before revisions).
        min_peer: The oldest revision the peer works with.
    """
    if version >= MIN_PEER_PROTOCOL and min_peer <= PROTOCOL_VERSION:
        return ""
    spoken = (
        "no protocol revision (an rlfleet before them)"
        if version == 0
        else (f"protocol {version} (works with {min_peer} and newer)")
    )
    return (
        f"{peer} speaks {spoken}; this build speaks protocol {PROTOCOL_VERSION} (works with "
        f"{MIN_PEER_PROTOCOL} and newer): run the same rlfleet release (or image) on the "
        "learner and every actor"
    )


#: gRPC's default receive limit; we keep it and chunk above it.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: Payload bytes per chunk message, leaving headroom under MAX_MESSAGE_BYTES.
CHUNK_BYTES = 3 * 1024 * 1024
#: The most frames one actor's batch may hold (4,194,304; an actor also refuses
#: batches whose packet would exceed the learner's 1 GiB packet cap). A batch
#: is collected whole before it is sent, so this bounds the actor's memory and the
#: time a batch holds the env pool.
MAX_FRAMES_PER_BATCH = 1 << 22
#: The largest ``worker_id`` (an actor's id in its fleet; ``--worker-id``).
MAX_WORKER_ID = 65535
#: The largest env pool (an LLM actor's chat slots) one actor holds (``--num-envs``).
MAX_NUM_ENVS = 4096
#: The most unconsumed credits (and retained batches) an actor may honour (``--max-credits``).
MAX_CREDITS = 1024
#: The port an actor listens on unless told otherwise.
DEFAULT_PORT = 50051
#: The model that acts, and that weights are addressed to, unless told otherwise.
DEFAULT_MODEL_ID = "policy"
#: The largest policy version an actor accepts: every frame records its version as int64.
MAX_POLICY_VERSION = 2**63 - 1
#: The largest seed: seeds are uint64 on the wire (``SetSeedRequest.seed``).
MAX_SEED = 2**64 - 1
#: The longest ``model_id`` (an actor's ``--model`` names and every weight address).
MAX_MODEL_ID = 64
#: What a ``model_id`` is: letters, digits, ``_``, ``.`` and ``-``, not led by ``.`` or ``-``,
#: at most :data:`MAX_MODEL_ID` characters (it names a ``--model ID=...`` flag).
MODEL_ID_RE = re.compile(rf"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_MODEL_ID - 1}}}\Z")
#: The longest bearer token: a server's metadata cap is 8 KiB (gRPC's default).
MAX_TOKEN = 4096
#: The longest ``learner_id`` a collector takes.
MAX_LEARNER_ID = 256
#: The longest ``OpenSession.learner_id`` an actor accepts: a collector's id, and the
#: ``/rank<r>`` a rank appends to it.
MAX_WIRE_LEARNER_ID = MAX_LEARNER_ID + 32
#: Call metadata naming the learner that makes a call (its ``learner_id``, UTF-8): an actor
#: takes a weight push, a state load or a reseed from the learner whose session is in
#: force, or from any learner while none is (a call without it, an older learner's, too).
LEARNER_ID_METADATA = "rlfleet-learner-id-bin"
#: Call metadata of a learner that takes sessions over (``take_over``): ``"1"``. Its calls
#: are taken while another learner's session is in force, which its ``open`` then ends.
TAKE_OVER_METADATA = "rlfleet-take-over"

# Keepalive: the client pings every 20 s and gives up 10 s after an unanswered
# ping; the server accepts pings 10 s apart, so the client never trips it.
_KEEPALIVE_TIME_MS = 20_000
_KEEPALIVE_TIMEOUT_MS = 10_000
_MIN_PING_INTERVAL_MS = 10_000


class ExplorationType(enum.Enum):
    """How the policy chooses actions while collecting (tensordict's InteractionType)."""

    RANDOM = "random"
    DETERMINISTIC = "deterministic"
    MODE = "mode"
    MEAN = "mean"


#: ``torch.compile`` backends a session may ask an actor for ("" is torch's default).
COMPILE_BACKENDS = ("", "inductor", "eager", "aot_eager", "cudagraphs")
#: ``torch.compile`` modes a session may ask an actor for ("" is torch's default).
COMPILE_MODES = ("", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: The longest device name a session may carry (``"cuda:15"`` needs 7).
_MAX_DEVICE_NAME = 32


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """``torch.compile`` options for the acting policy (TorchRL's ``compile_policy`` dict).

    Only plain options travel: each is checked against the values torch accepts, so
    nothing a learner sends makes an actor import or call anything else.

    Attributes:
        backend: ``torch.compile``'s backend (one of ``COMPILE_BACKENDS``; "" is inductor).
        mode: ``torch.compile``'s mode (one of ``COMPILE_MODES``; "" is the default).
        fullgraph: Refuse graph breaks (None: torch's default).
        dynamic: Dynamic shapes (None: torch's default, decided on recompilation).

    Raises:
        ValueError: A backend or mode not listed.
        TypeError: A flag that is not a bool or None.
    """

    backend: str = ""
    mode: str = ""
    fullgraph: bool | None = None
    dynamic: bool | None = None

    def __post_init__(self) -> None:
        if self.backend not in COMPILE_BACKENDS:
            raise ValueError(
                f"compile backend must be one of {COMPILE_BACKENDS}, got {self.backend!r:.60}"
            )
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {self.mode!r:.60}")
        for name in ("fullgraph", "dynamic"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"compile {name} must be a bool or None, got {value!r:.60}")

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments for ``torch.compile`` (unset options left out)."""
        named = {"backend": self.backend, "mode": self.mode}
        flags = {"fullgraph": self.fullgraph, "dynamic": self.dynamic}
        return {k: v for k, v in named.items() if v} | {
            k: v for k, v in flags.items() if v is not None
        }


def same_device(requested: str, actual: object) -> bool:
    """Whether the device a session names is the device an actor runs on.

    ``"cuda"`` without an index matches any CUDA device; ``"cuda:1"`` only the second.
    """
    import torch

    want, have = torch.device(requested), torch.device(str(actual))
    if want.type != have.type:
        return False
    return want.index is None or want.index == (have.index or 0)


def local_device(value: object, what: str) -> torch.device:
    """``value`` as a ``torch.device`` this process has (a CUDA one with its index).

    The one check of a device that is used here, not sent away: the learner's
    ``device`` / ``storing_device`` and an actor's ``--device``.

    Raises:
        ValueError: Naming ``what``: not a torch device, the meta device, CUDA without
            CUDA, no such CUDA device, or another backend this process cannot use (``mps``
            off a Mac).
    """
    import torch  # common.config stays importable without torch loaded

    try:
        device: torch.device = torch.device(value)  # type: ignore[call-overload]
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(
            f"{what}: {value!r:.60} is not a torch device (it must be a torch device such as "
            "'cpu', 'cuda' or 'cuda:1')"
        ) from None
    if device.type == "meta":
        raise ValueError(f"{what}={value!r}: the meta device holds no data; use 'cpu' or 'cuda'")
    if device.type == "cpu":
        return device
    if device.type != "cuda":  # mps, xla, xpu...: torch parses every backend it knows of
        try:
            torch.empty(0, device=device)
        except Exception as exc:  # each backend fails its own way (NotImplementedError...)
            raise ValueError(
                f"{what}={value!r}: no {device.type} device here (torch cannot place a tensor "
                f"on it: {type(exc).__name__}); use 'cpu' or 'cuda'"
            ) from None
        return device
    if not torch.cuda.is_available():
        raise ValueError(
            f"{what}={value!r}: no CUDA device here (this process does not have one torch can "
            "use: torch.cuda.is_available() is False); use 'cpu'"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise ValueError(
            f"{what}={value!r}: no such CUDA device (torch sees {torch.cuda.device_count()})"
        )
    return torch.device("cuda", index)


def check_device_name(name: object, what: str) -> str:
    """Return ``name`` if it is "" (no request) or a short device name torch parses.

    Raises:
        ValueError: Naming ``what`` and the value.
    """
    if not isinstance(name, str) or len(name) > _MAX_DEVICE_NAME:
        raise ValueError(f"{what} must be a device name of at most 32 characters, got {name!r:.60}")
    if name:
        import torch  # common.config stays importable without torch loaded

        try:
            torch.device(name)
        except (RuntimeError, ValueError):
            raise ValueError(f"{what} is not a device torch knows: {name!r}") from None
    return name


@dataclasses.dataclass(frozen=True)
class CollectSettings:
    """The knobs of one collection session, as in TorchRL's ``Collector``.

    Attributes:
        frames_per_batch: Frames per batch from one actor; a multiple of its env pool size.
            The actor refuses more than ``MAX_FRAMES_PER_BATCH`` or than fit its packet cap.
        max_frames_per_traj: Steps after which a trajectory is truncated; ``<= 0`` means none.
        init_random_frames: Frames collected with random actions before the policy acts,
            counted from the start of the session (each batch that starts below it is random).
        reset_at_each_iter: Reset every env before each batch.
        reset_when_done: Reset envs whose episode ended; must be True, as in TorchRL.
        split_trajs: Split each batch into zero-padded trajectories with a mask.
        exploration_type: The interaction type set while the policy acts.
        set_truncated: Mark the last frame of each batch truncated (and done).
        total_frames: Frames the session may produce; ``< 0`` means endless.
        model_id: The registered model that acts.
        llm: LLM collection settings (``frames_per_batch`` and ``total_frames`` then count
            dialog turns); None for env actors.
        fold_observations: Send each observation once (:mod:`common.packets.folding`); the
            receiver rebuilds ``("next", key)``. Ignored with ``split_trajs``.
        policy_device: The device the learner expects the policy on ("": the actor's own);
            an actor on another device refuses the session.
        env_device: The device the learner expects the envs on ("": the actor's own).
        compile_policy: ``torch.compile`` the acting policy for the session; None: eager.
        cudagraph_policy: Capture the acting policy in CUDA graphs (CUDA actors only).
    """

    frames_per_batch: int
    max_frames_per_traj: int = -1
    init_random_frames: int = 0
    reset_at_each_iter: bool = False
    reset_when_done: bool = True
    split_trajs: bool = False
    exploration_type: ExplorationType = ExplorationType.RANDOM
    set_truncated: bool = False
    total_frames: int = -1
    model_id: str = DEFAULT_MODEL_ID
    llm: LLMSettings | None = None
    fold_observations: bool = False
    policy_device: str = ""
    env_device: str = ""
    compile_policy: CompileSettings | None = None
    cudagraph_policy: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.frames_per_batch, int) or self.frames_per_batch <= 0:
            raise ValueError(
                f"frames_per_batch must be a positive int, got {self.frames_per_batch!r}"
            )
        if not self.reset_when_done:
            raise ValueError("reset_when_done=False is not supported (TorchRL deprecated it too)")
        if not isinstance(self.exploration_type, ExplorationType):
            raise TypeError(
                f"exploration_type must be an ExplorationType, got {self.exploration_type!r}"
            )
        check_model_id(self.model_id)
        if self.llm is not None and not isinstance(self.llm, LLMSettings):
            raise TypeError(f"llm must be an LLMSettings or None, got {type(self.llm).__name__}")
        if self.llm is not None:
            check_no_env_settings(vars(self))
        check_device_name(self.policy_device, "policy_device")
        check_device_name(self.env_device, "env_device")
        if self.compile_policy is not None and not isinstance(self.compile_policy, CompileSettings):
            raise TypeError(
                f"compile_policy must be a CompileSettings or None, got {self.compile_policy!r:.60}"
            )


# Env collection's knobs that mean nothing to LLM actors (a dialog's turn limit is max_turns).
_ENV_ONLY_SETTINGS = (
    "max_frames_per_traj",
    "init_random_frames",
    "split_trajs",
    "set_truncated",
    "compile_policy",
    "cudagraph_policy",
)


def check_no_env_settings(values: dict[str, Any]) -> None:
    """An LLM collection's settings ``values`` ask for none of env collection's knobs.

    A knob is unset at None, False or a count ``<= 0`` (TorchRL's "none").

    Raises:
        ValueError: Naming each one set, so that it is not silently ignored.
    """
    asked = [
        f"{name}={values[name]!r:.40}"
        for name in _ENV_ONLY_SETTINGS
        if values.get(name) and not (type(values[name]) is int and values[name] <= 0)
    ]
    if asked:
        raise ValueError(
            f"LLM collection takes none of env collection's {', '.join(asked)} (LLM actors "
            "would ignore them; a dialog's turn limit is max_turns)"
        )


#: A host name or IPv4 address: dot-separated labels.
_HOST_NAME = r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*"
#: A host name or IPv4 address, or a bracketed IPv6 address (a relay's target).
_HOST = _HOST_NAME + r"|\[[0-9A-Fa-f:.]+\]"
#: An actor's host as gRPC dials it: also a name's trailing dot (no search domains) and an
#: IPv6 address's zone (``[fe80::1%eth0]``, which getaddrinfo gives for a link-local name).
_DIALED_HOST = _HOST_NAME + r"\.?|\[[0-9A-Fa-f:.]+(?:%[\w.-]+)?\]"
#: The longest host name DNS has (an address gRPC dials by it is no longer).
_MAX_HOST = 253


def check_actor_address(address: str) -> str:
    """Return ``address`` if it is ``host:port`` gRPC can dial.

    The host: a host name, an IPv4 address or a bracketed IPv6 one (``ipv4:``/``ipv6:``
    before it allowed, as gRPC reads them); the port in 1..65535.

    Raises:
        ValueError: Naming the address and the fix (gRPC would dial a larger port modulo
            65536, a host alone on port 443, and fail any other host after connect_timeout).
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()):
        raise ValueError(f"actor address must be 'host:port', got {address!r:.100}")
    if not 0 < int(port) <= 65535:
        raise ValueError(f"actor address {address!r:.100}: the port must be in 1..65535")
    bare = _without_scheme(host).lstrip("/")
    if len(bare) > _MAX_HOST or not re.fullmatch(_DIALED_HOST, bare):
        raise ValueError(
            f"actor address {address!r:.100}: the host must be a host name, an IPv4 address "
            f"or a bracketed IPv6 address{_host_hint(bare)}"
        )
    return address


def check_bind_host(host: object) -> str:
    """Return ``host`` if an actor can bind it: an IP address (IPv6 bracketed or not) or a name.

    Raises:
        TypeError: Not a string.
        ValueError: Anything else (spaces, a path, a URL), naming it.
    """
    if not isinstance(host, str):
        raise TypeError(f"host must be the address to bind as a string, got {host!r:.80}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(bare)
        return host
    if len(bare) <= _MAX_HOST and re.fullmatch(_HOST_NAME + r"\.?", bare):
        return host
    raise ValueError(
        f"host must be an address of this machine to bind (an IP address or a host name; "
        f"actors listen on TCP), got {host!r:.80}"
    )


#: The bind addresses meaning "every interface": an actor bound to one is dialed at an address
#: of its machine (its loopback from the same machine, its IP from another).
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]"})


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC reads it: an IPv6 literal bracketed once (``[::1]:50051``)."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def _host_hint(host: str) -> str:
    """What a host an actor address cannot have looks like it was meant to be."""
    if "," in host:
        return " (one address per entry of the list)"
    if host.lower().startswith(("unix:", "unix-abstract:", "vsock:")):
        return " (actors listen on TCP only)"
    if "/" in host or host.lower().startswith(("http:", "https:")):
        return " (an address, not a URL: 'host:port')"
    if ":" in host and not host.startswith("["):
        return f" ('[{host}]:port' for an IPv6 address)"
    if not host.isascii():
        return " (a name in its ASCII, xn-- form)"
    return ""


def _without_scheme(host: str) -> str:
    """``host`` without the ``ipv4:``/``ipv6:`` gRPC reads before an address."""
    return host[5:] if host[:5].lower() in ("ipv4:", "ipv6:") else host


def is_loopback(host: str) -> bool:
    """Whether ``host`` (to bind or dial; ``[...]``, ``ipv4:``, ``ipv6:`` too) is this machine."""
    host = _without_scheme(host).lstrip("/")
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def check_model_id(model_id: object) -> str:
    """Return ``model_id`` if it matches :data:`MODEL_ID_RE` (at most :data:`MAX_MODEL_ID`).

    Raises:
        ValueError: Naming the value (its first 80 characters) and the rule.
    """
    if not isinstance(model_id, str) or not MODEL_ID_RE.match(model_id):
        raise ValueError(
            f"model_id must be 1 to {MAX_MODEL_ID} letters, digits, '_', '.' or '-' (not "
            f"led by '.' or '-'), got {model_id!r:.80}"
        )
    return model_id


def check_token(token: object) -> str | None:
    """``token`` if it is None or a bearer token a header can carry.

    Raises:
        ValueError: Empty, not a string, not printable ASCII (no line breaks), or longer than
            what servers take (:data:`MAX_TOKEN` characters).
    """
    if token is not None and (not isinstance(token, str) or not token):
        raise ValueError("token must be a non-empty string or None")
    if token is not None and not (token.isascii() and token.isprintable()):
        raise ValueError("token must hold printable ASCII characters only")
    if token is not None and len(token) > MAX_TOKEN:
        raise ValueError(f"token must be at most {MAX_TOKEN} characters, got {len(token)}")
    return token


def check_learner_id(learner_id: object, limit: int) -> str:
    """Return ``learner_id`` if it is a non-empty string of at most ``limit`` characters.

    Raises:
        ValueError: Naming the value (its first 80 characters).
    """
    if not isinstance(learner_id, str) or not 0 < len(learner_id) <= limit:
        raise ValueError(
            f"learner_id must be a string of 1 to {limit} characters, got {learner_id!r:.80}"
        )
    return learner_id


def as_int(value: object, *, whole_floats: bool = False) -> int | None:
    """``value`` as a Python int if it is an integer, else None.

    Integers are Python's, numpy's and one-element integer tensors (what TorchRL's
    collectors take by arithmetic); bools are not. With ``whole_floats``, a float without a
    fraction is one too (TorchRL reads its frame counts with ``int()``: ``total_frames=1e6``).
    """
    if isinstance(value, bool):
        return None
    if whole_floats and isinstance(value, float):
        return int(value) if value.is_integer() else None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def as_real(value: object) -> int | float | None:
    """``value`` as a real number if it is one (Python's or numpy's), else None.

    Python ints stay ints (a huge one compares exactly, where ``float()`` would overflow);
    bools, strings and tensors are not numbers of seconds.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return value if isinstance(value, int | float) else float(value)


def check_seed(seed: object) -> int:
    """Return ``seed`` as an int if it is an integer in ``[0, 2**64)``, a seed's wire range.

    Raises:
        ValueError: Naming the value.
    """
    value = as_int(seed)
    if value is None or not 0 <= value <= MAX_SEED:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return value


#: The longest address a relayed push may be forwarded to.
MAX_RELAY_ADDRESS = 255
#: The length of a relayed push's id (``Relay.push_id``), learner and actor alike.
RELAY_PUSH_ID_BYTES = 16
#: The lengths a relay ticket may have (``Relay.source_ticket``, ``forward_ticket``).
RELAY_TICKET_BYTES = (16, 64)


#: Names gRPC reads as a resolver scheme before a colon; never a relay's host.
_GRPC_SCHEMES = frozenset({"dns", "unix", "unix-abstract", "vsock", "ipv4", "ipv6", "xds"})
#: A host name or IPv4 address (dot-separated labels), or a bracketed IPv6 address; a port.
_RELAY_ADDRESS = re.compile(rf"(?:{_HOST}):(\d{{1,5}})")


def is_relay_address(address: str) -> bool:
    """Whether a relayed push may be forwarded to ``address``: a plain ``host:port``.

    A host name, an IPv4 address or a bracketed IPv6 one, then a port in 1..65535; at most
    :data:`MAX_RELAY_ADDRESS` characters. Nothing gRPC reads as a resolver (``dns:``,
    ``unix:``, ``unix-abstract:``, ``vsock:``, ``ipv4:``), no path. The learner relays only
    to such addresses; an actor refuses any other ``forward_to`` and dials it by name.
    """
    if not 0 < len(address) <= MAX_RELAY_ADDRESS:
        return False
    match = _RELAY_ADDRESS.fullmatch(address)
    if match is None or address.split(":", 1)[0].lower() in _GRPC_SCHEMES:
        return False
    return 0 < int(match.group(1)) <= 65535


def server_channel_options() -> list[tuple[str, int]]:
    """Channel options for actor servers, matched with :func:`client_channel_options`."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", _KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", _MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 1),
        # gRPC binds with SO_REUSEPORT by default: a second actor on a port in use would
        # start and take half of the new connections. Off, it fails to bind.
        ("grpc.so_reuseport", 0),
    ]


def client_channel_options() -> list[tuple[str, int]]:
    """Channel options for learner channels, matched with :func:`server_channel_options`."""
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", _KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", _KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.enable_retries", 0),
    ]


#: The longest timeout taken (about 116 days): gRPC fails a call whose deadline lies past
#: about 1e10 s at once, and Python's waits raise OverflowError further on.
MAX_TIMEOUT_S = 1e7


def positive_timeout(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a positive number of seconds, at most 1e7.

    Raises:
        TypeError: Not a number.
        ValueError: Not in (0, :data:`MAX_TIMEOUT_S`] (NaN and infinities included).
    """
    seconds = as_real(value)
    if seconds is None:
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 < seconds <= MAX_TIMEOUT_S:  # False for NaN; no float conversion of a huge int
        raise ValueError(
            f"{name} must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}, "
            f"got {value!r:.40}"
        )
    return float(seconds)
