from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ExplorationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EXPLORATION_TYPE_UNSPECIFIED: _ClassVar[ExplorationType]
    EXPLORATION_TYPE_RANDOM: _ClassVar[ExplorationType]
    EXPLORATION_TYPE_DETERMINISTIC: _ClassVar[ExplorationType]
    EXPLORATION_TYPE_MODE: _ClassVar[ExplorationType]
    EXPLORATION_TYPE_MEAN: _ClassVar[ExplorationType]

class EndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    END_REASON_UNSPECIFIED: _ClassVar[EndReason]
    END_REASON_BUDGET_REACHED: _ClassVar[EndReason]
    END_REASON_DRAINING: _ClassVar[EndReason]
    END_REASON_ERROR: _ClassVar[EndReason]
    END_REASON_TAKEN_OVER: _ClassVar[EndReason]
    END_REASON_CLOSED: _ClassVar[EndReason]

class PushOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUSH_OUTCOME_UNSPECIFIED: _ClassVar[PushOutcome]
    PUSH_OUTCOME_APPLIED: _ClassVar[PushOutcome]
    PUSH_OUTCOME_STAGED: _ClassVar[PushOutcome]
    PUSH_OUTCOME_COMPLETED: _ClassVar[PushOutcome]
EXPLORATION_TYPE_UNSPECIFIED: ExplorationType
EXPLORATION_TYPE_RANDOM: ExplorationType
EXPLORATION_TYPE_DETERMINISTIC: ExplorationType
EXPLORATION_TYPE_MODE: ExplorationType
EXPLORATION_TYPE_MEAN: ExplorationType
END_REASON_UNSPECIFIED: EndReason
END_REASON_BUDGET_REACHED: EndReason
END_REASON_DRAINING: EndReason
END_REASON_ERROR: EndReason
END_REASON_TAKEN_OVER: EndReason
END_REASON_CLOSED: EndReason
PUSH_OUTCOME_UNSPECIFIED: PushOutcome
PUSH_OUTCOME_APPLIED: PushOutcome
PUSH_OUTCOME_STAGED: PushOutcome
PUSH_OUTCOME_COMPLETED: PushOutcome

class CollectSettings(_message.Message):
    __slots__ = ("frames_per_batch", "max_frames_per_traj", "init_random_frames", "reset_at_each_iter", "reset_when_done", "split_trajs", "exploration_type", "set_truncated", "total_frames", "model_id", "llm", "fold_observations", "policy_device", "env_device", "compile_policy", "cudagraph_policy")
    FRAMES_PER_BATCH_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAMES_PER_TRAJ_FIELD_NUMBER: _ClassVar[int]
    INIT_RANDOM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    RESET_AT_EACH_ITER_FIELD_NUMBER: _ClassVar[int]
    RESET_WHEN_DONE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_TRAJS_FIELD_NUMBER: _ClassVar[int]
    EXPLORATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    SET_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LLM_FIELD_NUMBER: _ClassVar[int]
    FOLD_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_DEVICE_FIELD_NUMBER: _ClassVar[int]
    ENV_DEVICE_FIELD_NUMBER: _ClassVar[int]
    COMPILE_POLICY_FIELD_NUMBER: _ClassVar[int]
    CUDAGRAPH_POLICY_FIELD_NUMBER: _ClassVar[int]
    frames_per_batch: int
    max_frames_per_traj: int
    init_random_frames: int
    reset_at_each_iter: bool
    reset_when_done: bool
    split_trajs: bool
    exploration_type: ExplorationType
    set_truncated: bool
    total_frames: int
    model_id: str
    llm: LLMSettings
    fold_observations: bool
    policy_device: str
    env_device: str
    compile_policy: CompileSettings
    cudagraph_policy: bool
    def __init__(self, frames_per_batch: _Optional[int] = ..., max_frames_per_traj: _Optional[int] = ..., init_random_frames: _Optional[int] = ..., reset_at_each_iter: _Optional[bool] = ..., reset_when_done: _Optional[bool] = ..., split_trajs: _Optional[bool] = ..., exploration_type: _Optional[_Union[ExplorationType, str]] = ..., set_truncated: _Optional[bool] = ..., total_frames: _Optional[int] = ..., model_id: _Optional[str] = ..., llm: _Optional[_Union[LLMSettings, _Mapping]] = ..., fold_observations: _Optional[bool] = ..., policy_device: _Optional[str] = ..., env_device: _Optional[str] = ..., compile_policy: _Optional[_Union[CompileSettings, _Mapping]] = ..., cudagraph_policy: _Optional[bool] = ...) -> None: ...

class CompileSettings(_message.Message):
    __slots__ = ("backend", "mode", "fullgraph", "dynamic")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FULLGRAPH_FIELD_NUMBER: _ClassVar[int]
    DYNAMIC_FIELD_NUMBER: _ClassVar[int]
    backend: str
    mode: str
    fullgraph: bool
    dynamic: bool
    def __init__(self, backend: _Optional[str] = ..., mode: _Optional[str] = ..., fullgraph: _Optional[bool] = ..., dynamic: _Optional[bool] = ...) -> None: ...

class GenerationSettings(_message.Message):
    __slots__ = ("max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LLMSettings(_message.Message):
    __slots__ = ("generation", "group_size", "yield_completed_trajectories", "yield_only_last_steps", "max_turns", "token_versions", "vocab_size")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    YIELD_COMPLETED_TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    YIELD_ONLY_LAST_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    generation: GenerationSettings
    group_size: int
    yield_completed_trajectories: bool
    yield_only_last_steps: bool
    max_turns: int
    token_versions: bool
    vocab_size: int
    def __init__(self, generation: _Optional[_Union[GenerationSettings, _Mapping]] = ..., group_size: _Optional[int] = ..., yield_completed_trajectories: _Optional[bool] = ..., yield_only_last_steps: _Optional[bool] = ..., max_turns: _Optional[int] = ..., token_versions: _Optional[bool] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class OpenSession(_message.Message):
    __slots__ = ("settings", "credits", "take_over", "resume_epoch", "resume_after_seq", "learner_id", "shm_batches", "protocol_version", "min_peer_protocol")
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    CREDITS_FIELD_NUMBER: _ClassVar[int]
    TAKE_OVER_FIELD_NUMBER: _ClassVar[int]
    RESUME_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUME_AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    SHM_BATCHES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_PEER_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    settings: CollectSettings
    credits: int
    take_over: bool
    resume_epoch: int
    resume_after_seq: int
    learner_id: str
    shm_batches: bool
    protocol_version: int
    min_peer_protocol: int
    def __init__(self, settings: _Optional[_Union[CollectSettings, _Mapping]] = ..., credits: _Optional[int] = ..., take_over: _Optional[bool] = ..., resume_epoch: _Optional[int] = ..., resume_after_seq: _Optional[int] = ..., learner_id: _Optional[str] = ..., shm_batches: _Optional[bool] = ..., protocol_version: _Optional[int] = ..., min_peer_protocol: _Optional[int] = ...) -> None: ...

class Credit(_message.Message):
    __slots__ = ("batches", "ack_seq")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    ACK_SEQ_FIELD_NUMBER: _ClassVar[int]
    batches: int
    ack_seq: int
    def __init__(self, batches: _Optional[int] = ..., ack_seq: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class CloseSession(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CollectRequest(_message.Message):
    __slots__ = ("open", "credit", "ack", "close")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    open: OpenSession
    credit: Credit
    ack: Ack
    close: CloseSession
    def __init__(self, open: _Optional[_Union[OpenSession, _Mapping]] = ..., credit: _Optional[_Union[Credit, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., close: _Optional[_Union[CloseSession, _Mapping]] = ...) -> None: ...

class SessionOpened(_message.Message):
    __slots__ = ("worker_id", "epoch", "next_seq", "max_credits", "resumed", "acks_in_credit")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    MAX_CREDITS_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    ACKS_IN_CREDIT_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    epoch: int
    next_seq: int
    max_credits: int
    resumed: bool
    acks_in_credit: bool
    def __init__(self, worker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., next_seq: _Optional[int] = ..., max_credits: _Optional[int] = ..., resumed: _Optional[bool] = ..., acks_in_credit: _Optional[bool] = ...) -> None: ...

class BatchInfo(_message.Message):
    __slots__ = ("worker_id", "epoch", "seq", "frames", "crc32c", "model_id", "policy_version_min", "policy_version_max", "fold", "total_bytes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_MIN_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_MAX_FIELD_NUMBER: _ClassVar[int]
    FOLD_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    epoch: int
    seq: int
    frames: int
    crc32c: int
    model_id: str
    policy_version_min: int
    policy_version_max: int
    fold: ObservationFold
    total_bytes: int
    def __init__(self, worker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., frames: _Optional[int] = ..., crc32c: _Optional[int] = ..., model_id: _Optional[str] = ..., policy_version_min: _Optional[int] = ..., policy_version_max: _Optional[int] = ..., fold: _Optional[_Union[ObservationFold, _Mapping]] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class ObservationFold(_message.Message):
    __slots__ = ("finals_bytes",)
    FINALS_BYTES_FIELD_NUMBER: _ClassVar[int]
    finals_bytes: int
    def __init__(self, finals_bytes: _Optional[int] = ...) -> None: ...

class BatchChunk(_message.Message):
    __slots__ = ("seq", "index", "count", "data", "info", "shm")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    seq: int
    index: int
    count: int
    data: bytes
    info: BatchInfo
    shm: ShmSegment
    def __init__(self, seq: _Optional[int] = ..., index: _Optional[int] = ..., count: _Optional[int] = ..., data: _Optional[bytes] = ..., info: _Optional[_Union[BatchInfo, _Mapping]] = ..., shm: _Optional[_Union[ShmSegment, _Mapping]] = ...) -> None: ...

class EnvFailure(_message.Message):
    __slots__ = ("env", "exception_type", "exception_message", "message_withheld")
    ENV_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    EXCEPTION_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_WITHHELD_FIELD_NUMBER: _ClassVar[int]
    env: str
    exception_type: str
    exception_message: str
    message_withheld: bool
    def __init__(self, env: _Optional[str] = ..., exception_type: _Optional[str] = ..., exception_message: _Optional[str] = ..., message_withheld: _Optional[bool] = ...) -> None: ...

class StreamEnd(_message.Message):
    __slots__ = ("reason", "message", "last_seq", "env_failure")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    ENV_FAILURE_FIELD_NUMBER: _ClassVar[int]
    reason: EndReason
    message: str
    last_seq: int
    env_failure: EnvFailure
    def __init__(self, reason: _Optional[_Union[EndReason, str]] = ..., message: _Optional[str] = ..., last_seq: _Optional[int] = ..., env_failure: _Optional[_Union[EnvFailure, _Mapping]] = ...) -> None: ...

class CollectResponse(_message.Message):
    __slots__ = ("opened", "chunk", "end")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    opened: SessionOpened
    chunk: BatchChunk
    end: StreamEnd
    def __init__(self, opened: _Optional[_Union[SessionOpened, _Mapping]] = ..., chunk: _Optional[_Union[BatchChunk, _Mapping]] = ..., end: _Optional[_Union[StreamEnd, _Mapping]] = ...) -> None: ...

class WeightsHeader(_message.Message):
    __slots__ = ("model_id", "version", "total_bytes", "sha256", "crc32c", "base_version", "part", "shm", "relay")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    version: int
    total_bytes: int
    sha256: str
    crc32c: int
    base_version: int
    part: PartOf
    shm: ShmSegment
    relay: Relay
    def __init__(self, model_id: _Optional[str] = ..., version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., crc32c: _Optional[int] = ..., base_version: _Optional[int] = ..., part: _Optional[_Union[PartOf, _Mapping]] = ..., shm: _Optional[_Union[ShmSegment, _Mapping]] = ..., relay: _Optional[_Union[Relay, _Mapping]] = ...) -> None: ...

class Relay(_message.Message):
    __slots__ = ("push_id", "source_ticket", "forward_to", "forward_ticket", "stall_seconds")
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TICKET_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TO_FIELD_NUMBER: _ClassVar[int]
    FORWARD_TICKET_FIELD_NUMBER: _ClassVar[int]
    STALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    push_id: bytes
    source_ticket: bytes
    forward_to: str
    forward_ticket: bytes
    stall_seconds: float
    def __init__(self, push_id: _Optional[bytes] = ..., source_ticket: _Optional[bytes] = ..., forward_to: _Optional[str] = ..., forward_ticket: _Optional[bytes] = ..., stall_seconds: _Optional[float] = ...) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("open", "chunk")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    open: RelayOpen
    chunk: RelayChunk
    def __init__(self, open: _Optional[_Union[RelayOpen, _Mapping]] = ..., chunk: _Optional[_Union[RelayChunk, _Mapping]] = ...) -> None: ...

class RelayOpen(_message.Message):
    __slots__ = ("push_id", "ticket")
    PUSH_ID_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    push_id: bytes
    ticket: bytes
    def __init__(self, push_id: _Optional[bytes] = ..., ticket: _Optional[bytes] = ...) -> None: ...

class RelayChunk(_message.Message):
    __slots__ = ("data", "crc32c")
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    crc32c: int
    def __init__(self, data: _Optional[bytes] = ..., crc32c: _Optional[int] = ...) -> None: ...

class ForwardRequest(_message.Message):
    __slots__ = ("model_id", "version", "total_bytes", "crc32c", "relay")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    RELAY_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    version: int
    total_bytes: int
    crc32c: int
    relay: Relay
    def __init__(self, model_id: _Optional[str] = ..., version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., crc32c: _Optional[int] = ..., relay: _Optional[_Union[Relay, _Mapping]] = ...) -> None: ...

class ForwardResponse(_message.Message):
    __slots__ = ("bytes_received",)
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    bytes_received: int
    def __init__(self, bytes_received: _Optional[int] = ...) -> None: ...

class RelayResponse(_message.Message):
    __slots__ = ("bytes_received",)
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    bytes_received: int
    def __init__(self, bytes_received: _Optional[int] = ...) -> None: ...

class ShmSegment(_message.Message):
    __slots__ = ("name", "size", "crc32c")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    crc32c: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., crc32c: _Optional[int] = ...) -> None: ...

class PartOf(_message.Message):
    __slots__ = ("index", "count")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    index: int
    count: int
    def __init__(self, index: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class PushWeightsRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: WeightsHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[WeightsHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class PushWeightsResponse(_message.Message):
    __slots__ = ("worker_id", "model_id", "version", "pause_seconds", "outcome", "parts_staged", "shm_refused", "relay_failed", "epoch")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    PARTS_STAGED_FIELD_NUMBER: _ClassVar[int]
    SHM_REFUSED_FIELD_NUMBER: _ClassVar[int]
    RELAY_FAILED_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    model_id: str
    version: int
    pause_seconds: float
    outcome: PushOutcome
    parts_staged: int
    shm_refused: str
    relay_failed: str
    epoch: int
    def __init__(self, worker_id: _Optional[int] = ..., model_id: _Optional[str] = ..., version: _Optional[int] = ..., pause_seconds: _Optional[float] = ..., outcome: _Optional[_Union[PushOutcome, str]] = ..., parts_staged: _Optional[int] = ..., shm_refused: _Optional[str] = ..., relay_failed: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class SpaceSpec(_message.Message):
    __slots__ = ("kind", "shape", "dtype", "low", "high", "n", "text")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    kind: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    low: _containers.RepeatedScalarFieldContainer[float]
    high: _containers.RepeatedScalarFieldContainer[float]
    n: _containers.RepeatedScalarFieldContainer[int]
    text: str
    def __init__(self, kind: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., low: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ..., n: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ...) -> None: ...

class ParameterInfo(_message.Message):
    __slots__ = ("name", "shape", "dtype")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model_id", "version", "parameters")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    version: int
    parameters: _containers.RepeatedCompositeFieldContainer[ParameterInfo]
    def __init__(self, model_id: _Optional[str] = ..., version: _Optional[int] = ..., parameters: _Optional[_Iterable[_Union[ParameterInfo, _Mapping]]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("shm_probe",)
    SHM_PROBE_FIELD_NUMBER: _ClassVar[int]
    shm_probe: ShmSegment
    def __init__(self, shm_probe: _Optional[_Union[ShmSegment, _Mapping]] = ...) -> None: ...

class DescribeResponse(_message.Message):
    __slots__ = ("worker_id", "epoch", "env_id", "observation_spec", "action_spec", "models", "num_envs", "env_backend", "device", "software_version", "max_credits", "busy", "kind", "policy", "max_new_tokens_cap", "part_deadline_seconds", "host_identity", "shm_probe_ok", "relays_over_tls", "learner_id", "draining", "frames", "uptime_seconds", "pushes_in_flight", "protocol_version", "min_peer_protocol")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPEC_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPEC_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    NUM_ENVS_FIELD_NUMBER: _ClassVar[int]
    ENV_BACKEND_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_CREDITS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_CAP_FIELD_NUMBER: _ClassVar[int]
    PART_DEADLINE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HOST_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    SHM_PROBE_OK_FIELD_NUMBER: _ClassVar[int]
    RELAYS_OVER_TLS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    UPTIME_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PUSHES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MIN_PEER_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    epoch: int
    env_id: str
    observation_spec: SpaceSpec
    action_spec: SpaceSpec
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    num_envs: int
    env_backend: str
    device: str
    software_version: str
    max_credits: int
    busy: bool
    kind: str
    policy: str
    max_new_tokens_cap: int
    part_deadline_seconds: float
    host_identity: str
    shm_probe_ok: bool
    relays_over_tls: bool
    learner_id: str
    draining: bool
    frames: int
    uptime_seconds: float
    pushes_in_flight: _containers.RepeatedCompositeFieldContainer[PushInFlight]
    protocol_version: int
    min_peer_protocol: int
    def __init__(self, worker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., env_id: _Optional[str] = ..., observation_spec: _Optional[_Union[SpaceSpec, _Mapping]] = ..., action_spec: _Optional[_Union[SpaceSpec, _Mapping]] = ..., models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., num_envs: _Optional[int] = ..., env_backend: _Optional[str] = ..., device: _Optional[str] = ..., software_version: _Optional[str] = ..., max_credits: _Optional[int] = ..., busy: _Optional[bool] = ..., kind: _Optional[str] = ..., policy: _Optional[str] = ..., max_new_tokens_cap: _Optional[int] = ..., part_deadline_seconds: _Optional[float] = ..., host_identity: _Optional[str] = ..., shm_probe_ok: _Optional[bool] = ..., relays_over_tls: _Optional[bool] = ..., learner_id: _Optional[str] = ..., draining: _Optional[bool] = ..., frames: _Optional[int] = ..., uptime_seconds: _Optional[float] = ..., pushes_in_flight: _Optional[_Iterable[_Union[PushInFlight, _Mapping]]] = ..., protocol_version: _Optional[int] = ..., min_peer_protocol: _Optional[int] = ...) -> None: ...

class PushInFlight(_message.Message):
    __slots__ = ("model_id", "version", "total_bytes", "received_bytes", "source", "seconds")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    version: int
    total_bytes: int
    received_bytes: int
    source: str
    seconds: float
    def __init__(self, model_id: _Optional[str] = ..., version: _Optional[int] = ..., total_bytes: _Optional[int] = ..., received_bytes: _Optional[int] = ..., source: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class StateHeader(_message.Message):
    __slots__ = ("total_bytes", "sha256", "allow_rollback")
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ALLOW_ROLLBACK_FIELD_NUMBER: _ClassVar[int]
    total_bytes: int
    sha256: str
    allow_rollback: bool
    def __init__(self, total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., allow_rollback: _Optional[bool] = ...) -> None: ...

class StateChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: StateHeader
    chunk: bytes
    def __init__(self, header: _Optional[_Union[StateHeader, _Mapping]] = ..., chunk: _Optional[bytes] = ...) -> None: ...

class GetStateRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadStateResponse(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    def __init__(self, worker_id: _Optional[int] = ...) -> None: ...

class SetSeedRequest(_message.Message):
    __slots__ = ("seed", "static_seed")
    SEED_FIELD_NUMBER: _ClassVar[int]
    STATIC_SEED_FIELD_NUMBER: _ClassVar[int]
    seed: int
    static_seed: bool
    def __init__(self, seed: _Optional[int] = ..., static_seed: _Optional[bool] = ...) -> None: ...

class SetSeedResponse(_message.Message):
    __slots__ = ("next_seed", "first_seq")
    NEXT_SEED_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_FIELD_NUMBER: _ClassVar[int]
    next_seed: int
    first_seq: int
    def __init__(self, next_seed: _Optional[int] = ..., first_seq: _Optional[int] = ...) -> None: ...
