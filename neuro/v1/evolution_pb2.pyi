from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROTOCOL_VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    PROTOCOL_VERSION_CURRENT: _ClassVar[ProtocolVersion]

class AtariDynamics(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATARI_DYNAMICS_UNSPECIFIED: _ClassVar[AtariDynamics]
    ATARI_DYNAMICS_PAPER: _ClassVar[AtariDynamics]
    ATARI_DYNAMICS_REGISTERED: _ClassVar[AtariDynamics]

class ResultDisposition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESULT_DISPOSITION_UNSPECIFIED: _ClassVar[ResultDisposition]
    RESULT_DISPOSITION_ACCEPTED: _ClassVar[ResultDisposition]
    RESULT_DISPOSITION_DUPLICATE: _ClassVar[ResultDisposition]
    RESULT_DISPOSITION_STALE: _ClassVar[ResultDisposition]
    RESULT_DISPOSITION_REJECTED: _ClassVar[ResultDisposition]
PROTOCOL_VERSION_UNSPECIFIED: ProtocolVersion
PROTOCOL_VERSION_CURRENT: ProtocolVersion
ATARI_DYNAMICS_UNSPECIFIED: AtariDynamics
ATARI_DYNAMICS_PAPER: AtariDynamics
ATARI_DYNAMICS_REGISTERED: AtariDynamics
RESULT_DISPOSITION_UNSPECIFIED: ResultDisposition
RESULT_DISPOSITION_ACCEPTED: ResultDisposition
RESULT_DISPOSITION_DUPLICATE: ResultDisposition
RESULT_DISPOSITION_STALE: ResultDisposition
RESULT_DISPOSITION_REJECTED: ResultDisposition

class NoiseTableSpec(_message.Message):
    __slots__ = ("seed", "size")
    SEED_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    seed: int
    size: int
    def __init__(self, seed: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class Genome(_message.Message):
    __slots__ = ("seeds", "mutation_power", "noise_table")
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    MUTATION_POWER_FIELD_NUMBER: _ClassVar[int]
    NOISE_TABLE_FIELD_NUMBER: _ClassVar[int]
    seeds: _containers.RepeatedScalarFieldContainer[int]
    mutation_power: float
    noise_table: NoiseTableSpec
    def __init__(self, seeds: _Optional[_Iterable[int]] = ..., mutation_power: _Optional[float] = ..., noise_table: _Optional[_Union[NoiseTableSpec, _Mapping]] = ...) -> None: ...

class EnvSpec(_message.Message):
    __slots__ = ("env_id", "atari_dynamics")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    ATARI_DYNAMICS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    atari_dynamics: AtariDynamics
    def __init__(self, env_id: _Optional[str] = ..., atari_dynamics: _Optional[_Union[AtariDynamics, str]] = ...) -> None: ...

class PolicySpec(_message.Message):
    __slots__ = ("architecture", "hidden_sizes", "inference_dtype", "factory", "options")
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZES_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    FACTORY_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    architecture: str
    hidden_sizes: _containers.RepeatedScalarFieldContainer[int]
    inference_dtype: str
    factory: str
    options: str
    def __init__(self, architecture: _Optional[str] = ..., hidden_sizes: _Optional[_Iterable[int]] = ..., inference_dtype: _Optional[str] = ..., factory: _Optional[str] = ..., options: _Optional[str] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("task_id", "run_id", "genome", "env", "policy", "episodes", "max_episode_steps", "env_seed", "lease_seconds", "perturbation", "behaviour_size")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    GENOME_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_STEPS_FIELD_NUMBER: _ClassVar[int]
    ENV_SEED_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PERTURBATION_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_SIZE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run_id: str
    genome: Genome
    env: EnvSpec
    policy: PolicySpec
    episodes: int
    max_episode_steps: int
    env_seed: int
    lease_seconds: float
    perturbation: EsPerturbation
    behaviour_size: int
    def __init__(self, task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., genome: _Optional[_Union[Genome, _Mapping]] = ..., env: _Optional[_Union[EnvSpec, _Mapping]] = ..., policy: _Optional[_Union[PolicySpec, _Mapping]] = ..., episodes: _Optional[int] = ..., max_episode_steps: _Optional[int] = ..., env_seed: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., perturbation: _Optional[_Union[EsPerturbation, _Mapping]] = ..., behaviour_size: _Optional[int] = ...) -> None: ...

class EsPerturbation(_message.Message):
    __slots__ = ("version", "noise_index", "sign", "sigma", "num_params", "parameters_sha256", "observation_size")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NOISE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SIGN_FIELD_NUMBER: _ClassVar[int]
    SIGMA_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMS_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_SHA256_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SIZE_FIELD_NUMBER: _ClassVar[int]
    version: int
    noise_index: int
    sign: int
    sigma: float
    num_params: int
    parameters_sha256: str
    observation_size: int
    def __init__(self, version: _Optional[int] = ..., noise_index: _Optional[int] = ..., sign: _Optional[int] = ..., sigma: _Optional[float] = ..., num_params: _Optional[int] = ..., parameters_sha256: _Optional[str] = ..., observation_size: _Optional[int] = ...) -> None: ...

class ParametersRequest(_message.Message):
    __slots__ = ("protocol_version", "worker_id", "version", "run_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    worker_id: str
    version: int
    run_id: str
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., worker_id: _Optional[str] = ..., version: _Optional[int] = ..., run_id: _Optional[str] = ...) -> None: ...

class ParametersChunk(_message.Message):
    __slots__ = ("version", "offset", "data", "total_bytes", "sha256")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    version: int
    offset: int
    data: bytes
    total_bytes: int
    sha256: str
    def __init__(self, version: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class LeaseRequest(_message.Message):
    __slots__ = ("protocol_version", "worker_id", "max_tasks", "unsupported_env_ids", "refusal")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    UNSUPPORTED_ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    worker_id: str
    max_tasks: int
    unsupported_env_ids: _containers.RepeatedScalarFieldContainer[str]
    refusal: RunRefusal
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., worker_id: _Optional[str] = ..., max_tasks: _Optional[int] = ..., unsupported_env_ids: _Optional[_Iterable[str]] = ..., refusal: _Optional[_Union[RunRefusal, _Mapping]] = ...) -> None: ...

class RunRefusal(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaseResponse(_message.Message):
    __slots__ = ("tasks", "retry_after_ms", "run_complete", "run_id")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    RUN_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[Task]
    retry_after_ms: int
    run_complete: bool
    run_id: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[Task, _Mapping]]] = ..., retry_after_ms: _Optional[int] = ..., run_complete: _Optional[bool] = ..., run_id: _Optional[str] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("task_id", "run_id", "episode_returns", "episode_frames", "frames", "error", "behaviours", "observation_sums", "busy_seconds")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURNS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOURS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SUMS_FIELD_NUMBER: _ClassVar[int]
    BUSY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run_id: str
    episode_returns: _containers.RepeatedScalarFieldContainer[float]
    episode_frames: _containers.RepeatedScalarFieldContainer[int]
    frames: int
    error: str
    behaviours: _containers.RepeatedScalarFieldContainer[float]
    observation_sums: ObservationSums
    busy_seconds: float
    def __init__(self, task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., episode_returns: _Optional[_Iterable[float]] = ..., episode_frames: _Optional[_Iterable[int]] = ..., frames: _Optional[int] = ..., error: _Optional[str] = ..., behaviours: _Optional[_Iterable[float]] = ..., observation_sums: _Optional[_Union[ObservationSums, _Mapping]] = ..., busy_seconds: _Optional[float] = ...) -> None: ...

class ObservationSums(_message.Message):
    __slots__ = ("count", "sum", "sum_of_squares")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    SUM_OF_SQUARES_FIELD_NUMBER: _ClassVar[int]
    count: float
    sum: _containers.RepeatedScalarFieldContainer[float]
    sum_of_squares: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, count: _Optional[float] = ..., sum: _Optional[_Iterable[float]] = ..., sum_of_squares: _Optional[_Iterable[float]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("protocol_version", "worker_id", "results")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    worker_id: str
    results: _containers.RepeatedCompositeFieldContainer[TaskResult]
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., worker_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[TaskResult, _Mapping]]] = ...) -> None: ...

class TaskAck(_message.Message):
    __slots__ = ("task_id", "disposition")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DISPOSITION_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    disposition: ResultDisposition
    def __init__(self, task_id: _Optional[str] = ..., disposition: _Optional[_Union[ResultDisposition, str]] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("acks",)
    ACKS_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[TaskAck]
    def __init__(self, acks: _Optional[_Iterable[_Union[TaskAck, _Mapping]]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("protocol_version", "worker_id", "task_ids")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    worker_id: str
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., worker_id: _Optional[str] = ..., task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("dropped_task_ids", "run_complete")
    DROPPED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    RUN_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    dropped_task_ids: _containers.RepeatedScalarFieldContainer[str]
    run_complete: bool
    def __init__(self, dropped_task_ids: _Optional[_Iterable[str]] = ..., run_complete: _Optional[bool] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("protocol_version", "worker_id", "task_ids")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    worker_id: str
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., worker_id: _Optional[str] = ..., task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: int
    def __init__(self, released: _Optional[int] = ...) -> None: ...

class AttachRequest(_message.Message):
    __slots__ = ("protocol_version", "worker_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    worker_id: str
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., worker_id: _Optional[str] = ...) -> None: ...

class AttachUpdate(_message.Message):
    __slots__ = ("run_complete",)
    RUN_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    run_complete: bool
    def __init__(self, run_complete: _Optional[bool] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("run_id", "env_id", "generation", "phase", "frames", "evaluations", "elite_score", "elite", "tasks_pending", "tasks_leased", "tasks_done", "workers", "leases_reissued", "run_complete", "worker_status", "workers_tracked", "runs", "utilisation")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    ELITE_SCORE_FIELD_NUMBER: _ClassVar[int]
    ELITE_FIELD_NUMBER: _ClassVar[int]
    TASKS_PENDING_FIELD_NUMBER: _ClassVar[int]
    TASKS_LEASED_FIELD_NUMBER: _ClassVar[int]
    TASKS_DONE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    LEASES_REISSUED_FIELD_NUMBER: _ClassVar[int]
    RUN_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    WORKER_STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_TRACKED_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    UTILISATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    env_id: str
    generation: int
    phase: str
    frames: int
    evaluations: int
    elite_score: float
    elite: Genome
    tasks_pending: int
    tasks_leased: int
    tasks_done: int
    workers: int
    leases_reissued: int
    run_complete: bool
    worker_status: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    workers_tracked: int
    runs: _containers.RepeatedCompositeFieldContainer[RunStatus]
    utilisation: float
    def __init__(self, run_id: _Optional[str] = ..., env_id: _Optional[str] = ..., generation: _Optional[int] = ..., phase: _Optional[str] = ..., frames: _Optional[int] = ..., evaluations: _Optional[int] = ..., elite_score: _Optional[float] = ..., elite: _Optional[_Union[Genome, _Mapping]] = ..., tasks_pending: _Optional[int] = ..., tasks_leased: _Optional[int] = ..., tasks_done: _Optional[int] = ..., workers: _Optional[int] = ..., leases_reissued: _Optional[int] = ..., run_complete: _Optional[bool] = ..., worker_status: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., workers_tracked: _Optional[int] = ..., runs: _Optional[_Iterable[_Union[RunStatus, _Mapping]]] = ..., utilisation: _Optional[float] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("name", "env_id", "seed", "label", "state", "generation", "frames", "elite_score", "error")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    ELITE_SCORE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    env_id: str
    seed: int
    label: str
    state: str
    generation: int
    frames: int
    elite_score: float
    error: str
    def __init__(self, name: _Optional[str] = ..., env_id: _Optional[str] = ..., seed: _Optional[int] = ..., label: _Optional[str] = ..., state: _Optional[str] = ..., generation: _Optional[int] = ..., frames: _Optional[int] = ..., elite_score: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("worker_id", "tasks_leased", "evaluations", "frames", "frames_per_second", "seconds_since_contact", "tasks_failed", "held_off_seconds", "refusal")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_LEASED_FIELD_NUMBER: _ClassVar[int]
    EVALUATIONS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    FRAMES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_CONTACT_FIELD_NUMBER: _ClassVar[int]
    TASKS_FAILED_FIELD_NUMBER: _ClassVar[int]
    HELD_OFF_SECONDS_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    tasks_leased: int
    evaluations: int
    frames: int
    frames_per_second: float
    seconds_since_contact: float
    tasks_failed: int
    held_off_seconds: float
    refusal: str
    def __init__(self, worker_id: _Optional[str] = ..., tasks_leased: _Optional[int] = ..., evaluations: _Optional[int] = ..., frames: _Optional[int] = ..., frames_per_second: _Optional[float] = ..., seconds_since_contact: _Optional[float] = ..., tasks_failed: _Optional[int] = ..., held_off_seconds: _Optional[float] = ..., refusal: _Optional[str] = ...) -> None: ...
