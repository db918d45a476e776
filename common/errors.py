"""The rlfleet exception tree and its mapping to and from gRPC status codes.

Every error rlfleet raises on purpose is an ``RlfleetError`` that also
subclasses the builtin a Python user would catch for the same situation, so
``except ValueError`` keeps working::

    RlfleetError
    ├── ProtocolError (ValueError)            INVALID_ARGUMENT  bad packet or message order
    │   └── PacketTooLargeError               RESOURCE_EXHAUSTED  over a size cap
    ├── WeightsError (ValueError)             INVALID_ARGUMENT  keys/shapes/dtypes/non-finite
    │   └── WeightsTooLargeError              RESOURCE_EXHAUSTED  over a size cap
    ├── UnknownModelError (LookupError)       NOT_FOUND         no such model_id
    ├── UnknownWorkerError (LookupError)      NOT_FOUND         no such worker_id
    ├── StaleVersionError (ValueError)        ABORTED           weight version not newer
    ├── SequenceConflictError (ValueError)    ABORTED           a seq that was never produced
    ├── SessionStateError (RuntimeError)      FAILED_PRECONDITION  call not valid now
    │   └── ClosedError                       FAILED_PRECONDITION  used after close()
    ├── ActorBusyError (RuntimeError)         RESOURCE_EXHAUSTED  another learner holds the actor
    ├── ActorUnavailableError (ConnectionError) UNAVAILABLE     draining, down, unreachable
    ├── EnvError (RuntimeError)               UNAVAILABLE       an actor's env raised
    ├── RelayFailedError (ConnectionError)    (never a status)  relayed bytes not whole
    ├── DeadlineError (TimeoutError)          DEADLINE_EXCEEDED a call ran out of time
    ├── AuthenticationError (PermissionError) UNAUTHENTICATED   missing or bad token
    │   └── PermissionDeniedError             PERMISSION_DENIED  known, but may not (a relay ticket)
    ├── DataLossError (OSError)               DATA_LOSS         checksum mismatch on reassembly
    └── InternalError (RuntimeError)          INTERNAL          a bug; details stay in the log

:func:`is_transient` is the one rule for which of them may succeed if the
call is repeated later (the actor was unreachable or slow).

Servers call :func:`to_status` to turn any exception into a status code and a
message that is safe to send (no tracebacks, paths or tensor contents); clients
call :func:`from_status` to turn a status back into the matching exception.
"""

from __future__ import annotations

import re
import resource
import uuid

import grpc

__all__ = [
    "ActorBusyError",
    "ActorUnavailableError",
    "AuthenticationError",
    "ClosedError",
    "DataLossError",
    "DeadlineError",
    "EnvError",
    "InternalError",
    "MAX_ENV_MESSAGE",
    "PacketTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "RelayFailedError",
    "RlfleetError",
    "SequenceConflictError",
    "SessionStateError",
    "StaleVersionError",
    "UnknownModelError",
    "UnknownWorkerError",
    "WeightsError",
    "WeightsTooLargeError",
    "from_status",
    "is_transient",
    "one_line",
    "tls_mismatch_hint",
    "to_status",
    "exception_text",
    "fd_limit_hint",
]


class RlfleetError(Exception):
    """Base class of every error rlfleet raises on purpose."""

    status_code: grpc.StatusCode = grpc.StatusCode.INTERNAL


class ProtocolError(RlfleetError, ValueError):
    """A peer broke the wire contract: a malformed packet, or a message out of order."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


class PacketTooLargeError(ProtocolError):
    """A packet (or part of it) exceeds a configured size cap."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class WeightsError(RlfleetError, ValueError):
    """Weights do not fit the target model (keys, shapes, dtypes) or are not finite."""

    status_code = grpc.StatusCode.INVALID_ARGUMENT


class WeightsTooLargeError(WeightsError):
    """A weight or state blob exceeds the configured size cap."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnknownModelError(RlfleetError, LookupError):
    """No model is registered under the given ``model_id``."""

    status_code = grpc.StatusCode.NOT_FOUND

    def __str__(self) -> str:  # LookupError would otherwise repr() the message.
        return str(self.args[0]) if self.args else ""


class UnknownWorkerError(RlfleetError, LookupError):
    """No actor in the fleet has the given ``worker_id``."""

    status_code = grpc.StatusCode.NOT_FOUND

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StaleVersionError(RlfleetError, ValueError):
    """A weight version is not newer than the one in force."""

    status_code = grpc.StatusCode.ABORTED


class SequenceConflictError(RlfleetError, ValueError):
    """A batch seq (an ack, a resume point) names a batch that was never produced."""

    status_code = grpc.StatusCode.ABORTED


class SessionStateError(RlfleetError, RuntimeError):
    """The call is not valid in the current state (e.g. data before the handshake)."""

    status_code = grpc.StatusCode.FAILED_PRECONDITION


class ClosedError(SessionStateError):
    """The object was closed (or shut down) and cannot be used any more."""


class ActorBusyError(RlfleetError, RuntimeError):
    """The actor already serves another learner session (or another cap is reached)."""

    status_code = grpc.StatusCode.RESOURCE_EXHAUSTED

    @classmethod
    def held(cls, worker_id: int, owner: str, rule: str, *, where: str = "") -> ActorBusyError:
        """The refusal of a learner while learner ``owner``'s session holds actor ``worker_id``.

        One wording for the actor's refusals and the learner's own check, naming the fix.

        Args:
            worker_id: The held actor.
            owner: The id of the learner whose session is in force.
            rule: What a learner does only on its own session (``"resumes only its own
                session"``, ``"pushes weights only on ..."``).
            where: The actor's address, when the learner says it.
        """
        prefix = f"{where}: " if where else ""
        return cls(
            f"{prefix}actor {worker_id} is serving learner {owner!r}; a learner {rule} "
            "(take_over=True on GrpcCollector, --take-over on rlfleet-train, ends another "
            "learner's session)"
        )


class ActorUnavailableError(RlfleetError, ConnectionError):
    """The actor is draining, down or cannot be reached."""

    status_code = grpc.StatusCode.UNAVAILABLE


class RelayFailedError(RlfleetError, ConnectionError):
    """A relayed push's bytes did not arrive whole at an actor; it applied nothing.

    The actor raises it when its relay's bytes stall, end early or fail the header's
    digests, and answers the push ``relay_failed`` (never a call's status); the learner
    raises it on that answer and sends that actor the bytes itself.
    """

    status_code = grpc.StatusCode.UNAVAILABLE


#: The characters of an env exception's text (and of its type's name) an EnvError keeps: it
#: travels in the ``end`` an actor sends, under the learner's message cap.
MAX_ENV_MESSAGE = 4000


def _kept_text(text: str, most: int = MAX_ENV_MESSAGE) -> str:
    """``text`` as an EnvError keeps it: at most ``most`` characters, valid UTF-8.

    A lone surrogate (bytes decoded with ``surrogateescape``) cannot go into a protobuf
    string: it is written as its backslash escape.
    """
    cut = text if len(text) <= most else text[: most - 3] + "..."
    sendable = cut.encode("utf-8", "backslashreplace").decode("utf-8")
    return sendable if len(sendable) <= most else sendable[: most - 3] + "..."


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or what it is when its ``__str__`` raises (a user's exception's bug)."""
    try:
        return str(exc)
    except Exception as broken:  # any error of a user's __str__
        return f"<str() of the {type(exc).__name__} raised {type(broken).__name__}>"


class EnvError(RlfleetError, RuntimeError):
    """An env raised while an actor stepped or reset it.

    The actor raises it around the env's own exception; a learner raises it
    (with ``worker_id`` set) once an actor's env kept failing. The exception's
    text is None when the actor withholds it (``--env-error-detail type``); its text and
    type's name are kept to ``MAX_ENV_MESSAGE`` characters of valid UTF-8.

    Args:
        env: The env's name (gymnasium id or factory).
        exception_type: The env exception's class name.
        exception_message: Its text, or None when withheld.
        worker_id: The actor whose env failed, when known.
        attempts: How many sessions failed this way before the error was raised.
    """

    status_code = grpc.StatusCode.UNAVAILABLE

    def __init__(
        self,
        env: str,
        exception_type: str,
        exception_message: str | None,
        *,
        worker_id: int | None = None,
        attempts: int = 1,
    ) -> None:
        if exception_message is not None:
            exception_message = _kept_text(exception_message)
        self.env = env
        self.exception_type = exception_type = _kept_text(exception_type)
        self.exception_message = exception_message
        self.worker_id = worker_id
        self.attempts = attempts
        where = "" if worker_id is None else f"worker_id {worker_id}: "
        what = (
            f"{exception_type} (message withheld by the actor)"
            if exception_message is None
            else f"{exception_type}: {exception_message}"
        )
        tries = f" ({attempts} attempts)" if attempts > 1 else ""
        super().__init__(f"{where}env {env!r} raised {what}{tries}")

    @classmethod
    def of(cls, env: str, exc: BaseException, context: str = "") -> EnvError:
        """The EnvError around ``exc``, which ``env`` raised (``context`` leads its text)."""
        return cls(env, type(exc).__name__, context + exception_text(exc))

    def __reduce__(self) -> tuple[object, ...]:  # picklable despite the keyword arguments
        return (
            _rebuild_env_error,
            (self.env, self.exception_type, self.exception_message, self.worker_id, self.attempts),
        )


def _rebuild_env_error(
    env: str, exc_type: str, message: str | None, worker_id: int | None, attempts: int
) -> EnvError:
    return EnvError(env, exc_type, message, worker_id=worker_id, attempts=attempts)


class DeadlineError(RlfleetError, TimeoutError):
    """A call or a wait ran out of time."""

    status_code = grpc.StatusCode.DEADLINE_EXCEEDED


class AuthenticationError(RlfleetError, PermissionError):
    """Credentials are missing or wrong."""

    status_code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(AuthenticationError):
    """The caller is known but may not do this (a relay ticket the learner did not name)."""

    status_code = grpc.StatusCode.PERMISSION_DENIED


class DataLossError(RlfleetError, OSError):
    """A reassembled batch failed its checksum."""

    status_code = grpc.StatusCode.DATA_LOSS


class InternalError(RlfleetError, RuntimeError):
    """A bug; the peer's log holds the details under the correlation id."""

    status_code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[RlfleetError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: ProtocolError,
    grpc.StatusCode.NOT_FOUND: UnknownModelError,
    grpc.StatusCode.ABORTED: StaleVersionError,
    grpc.StatusCode.FAILED_PRECONDITION: SessionStateError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ActorBusyError,
    grpc.StatusCode.UNAVAILABLE: ActorUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.DATA_LOSS: DataLossError,
    grpc.StatusCode.CANCELLED: ActorUnavailableError,
}

# Status details travel in HTTP/2 trailers; keep them short and single-line.
_MAX_DETAILS = 1000


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Map an exception to the gRPC status code and message a server sends.

    Our own errors keep their message; anything else is a bug and becomes
    ``INTERNAL`` with a correlation id, so no traceback, path or tensor
    content crosses the wire. The caller logs ``exc`` with that id.

    Args:
        exc: The exception raised while serving a call.

    Returns:
        ``(code, details)`` for ``context.abort``.
    """
    if isinstance(exc, RlfleetError):
        return exc.status_code, one_line(str(exc))
    correlation_id = uuid.uuid4().hex[:12]
    return grpc.StatusCode.INTERNAL, f"internal error (correlation id {correlation_id})"


def from_status(code: grpc.StatusCode, details: str | None, *, peer: str = "") -> RlfleetError:
    """Map a gRPC status received by a client back to the matching exception.

    Args:
        code: The status code of the failed call.
        details: The status message the server sent.
        peer: The address of the actor, prefixed to the message when given.

    Returns:
        An ``RlfleetError`` subclass instance (not raised).
    """
    cls = _BY_CODE.get(code, InternalError)
    if code == grpc.StatusCode.INVALID_ARGUMENT and details and "weight" in details.lower():
        cls = WeightsError
    if code == grpc.StatusCode.ABORTED and details and "seq" in details.lower():
        cls = SequenceConflictError
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and details:
        cls = _over_a_cap(details)
    message = f"{code.name}: {details or 'no details'}"
    return cls(f"{peer}: {message}" if peer else message)


# How the caps' refusals word it (common.weights, common.packets, the actor's parts and LLM
# batches; gRPC's own message cap): RESOURCE_EXHAUSTED is a busy actor otherwise.
_WEIGHTS_CAP = re.compile(r"bytes exceeds the cap of \d+ bytes|bytes, more than the model's \d+")
_PACKET_CAP = re.compile(
    r"max_(packet_bytes|header_bytes|entries|key_length|strings)\b|-byte packet cap"
    r"|message larger than"
)


def _over_a_cap(details: str) -> type[RlfleetError]:
    """A RESOURCE_EXHAUSTED status's class: a blob or packet over its cap, else a busy actor."""
    if _WEIGHTS_CAP.search(details):
        return WeightsTooLargeError
    if _PACKET_CAP.search(details):
        return PacketTooLargeError
    return ActorBusyError


def is_transient(exc: BaseException) -> bool:
    """Whether a failed call may succeed if repeated later (the actor was unreachable or slow)."""
    return isinstance(exc, ActorUnavailableError | DeadlineError)


def one_line(text: str) -> str:
    """``text`` on one line and cut to 1,000 characters: what a peer's message may fill."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAILS else text[: _MAX_DETAILS - 3] + "..."


def fd_limit_hint(reason: str) -> str:
    """The fix ("; " first) when ``reason`` reads as this process out of file descriptors.

    ``EMFILE`` ("Too many open files", as the OS and gRPC word it): a learner holds a
    connection and up to 4 mapped segments per actor, an actor a connection per learner
    and a few segments per session. Any other reason (the whole system out of them
    included) gets "".
    """
    if "Too many open files" not in reason or "in system" in reason:
        return ""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = "no hard limit" if hard == resource.RLIM_INFINITY else f"hard limit {hard}"
    return (
        f"; this process used all {soft} file descriptors it may open: raise its limit "
        f"(ulimit -n where it starts, {most}; a container's nofile ulimit)"
    )


def tls_mismatch_hint(
    reason: str, *, tls: bool, add_tls: str, drop_tls: str, add_client_cert: str
) -> str:
    """The fix ("; " first) when a failed connection's ``reason`` reads as TLS on one end only.

    A TLS actor closes a plaintext connection at once ("Socket closed"), and a TLS one
    without the client certificate it asks for (``--tls-client-ca``) the same way; a
    plaintext actor answers a TLS handshake in HTTP/2 (OpenSSL's ``WRONG_VERSION_NUMBER``).
    Any other reason gets "".

    Args:
        reason: The connection's error, as gRPC words it.
        tls: The failed connection was TLS.
        add_tls: How the caller turns TLS on (an option or flag to name).
        drop_tls: How the caller turns it off.
        add_client_cert: How the caller gives a client certificate.
    """
    if not tls and "Socket closed" in reason:
        return f"; if the actor serves TLS (--tls-cert), {add_tls}"
    if tls and "Socket closed" in reason:
        return (
            "; if the actor asks for client certificates (--tls-client-ca), "
            f"{add_client_cert}, signed by a CA it trusts"
        )
    if tls and "WRONG_VERSION_NUMBER" in reason:
        start_tls = "start it with --tls-cert and --tls-key"
        return f"; the actor answers in plaintext: {start_tls}, or {drop_tls}"
    return ""
