from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class LeafSpec(_message.Message):
    __slots__ = ("key", "dtype", "shape", "space", "low", "high", "n", "start", "nest")
    KEY_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    SPACE_FIELD_NUMBER: _ClassVar[int]
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    NEST_FIELD_NUMBER: _ClassVar[int]
    key: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    space: str
    low: Tensor
    high: Tensor
    n: int
    start: int
    nest: str
    def __init__(self, key: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., space: _Optional[str] = ..., low: _Optional[_Union[Tensor, _Mapping]] = ..., high: _Optional[_Union[Tensor, _Mapping]] = ..., n: _Optional[int] = ..., start: _Optional[int] = ..., nest: _Optional[str] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("bool_value", "int_value", "float_value", "string_value", "tensor_value")
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    TENSOR_VALUE_FIELD_NUMBER: _ClassVar[int]
    bool_value: bool
    int_value: int
    float_value: float
    string_value: str
    tensor_value: Tensor
    def __init__(self, bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., string_value: _Optional[str] = ..., tensor_value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ResetOption(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: Value
    def __init__(self, name: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("protocol_versions", "client_version", "token")
    PROTOCOL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    protocol_versions: _containers.RepeatedScalarFieldContainer[int]
    client_version: str
    token: str
    def __init__(self, protocol_versions: _Optional[_Iterable[int]] = ..., client_version: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class HandshakeReply(_message.Message):
    __slots__ = ("protocol_version", "server_protocol_versions", "server_version", "observation", "action", "num_lanes", "reset_options", "capabilities", "info_keys", "env_name", "dt", "shared_memory")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVER_PROTOCOL_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    NUM_LANES_FIELD_NUMBER: _ClassVar[int]
    RESET_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    INFO_KEYS_FIELD_NUMBER: _ClassVar[int]
    ENV_NAME_FIELD_NUMBER: _ClassVar[int]
    DT_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    server_protocol_versions: _containers.RepeatedScalarFieldContainer[int]
    server_version: str
    observation: _containers.RepeatedCompositeFieldContainer[LeafSpec]
    action: _containers.RepeatedCompositeFieldContainer[LeafSpec]
    num_lanes: int
    reset_options: _containers.RepeatedCompositeFieldContainer[ResetOption]
    capabilities: _containers.RepeatedScalarFieldContainer[str]
    info_keys: _containers.RepeatedScalarFieldContainer[str]
    env_name: str
    dt: float
    shared_memory: str
    def __init__(self, protocol_version: _Optional[int] = ..., server_protocol_versions: _Optional[_Iterable[int]] = ..., server_version: _Optional[str] = ..., observation: _Optional[_Iterable[_Union[LeafSpec, _Mapping]]] = ..., action: _Optional[_Iterable[_Union[LeafSpec, _Mapping]]] = ..., num_lanes: _Optional[int] = ..., reset_options: _Optional[_Iterable[_Union[ResetOption, _Mapping]]] = ..., capabilities: _Optional[_Iterable[str]] = ..., info_keys: _Optional[_Iterable[str]] = ..., env_name: _Optional[str] = ..., dt: _Optional[float] = ..., shared_memory: _Optional[str] = ...) -> None: ...

class LaneReset(_message.Message):
    __slots__ = ("lane", "seed", "options", "max_episode_seconds")
    class OptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    LANE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lane: int
    seed: int
    options: _containers.MessageMap[str, Value]
    max_episode_seconds: float
    def __init__(self, lane: _Optional[int] = ..., seed: _Optional[int] = ..., options: _Optional[_Mapping[str, Value]] = ..., max_episode_seconds: _Optional[float] = ...) -> None: ...

class ActionBatch(_message.Message):
    __slots__ = ("lanes", "counts", "actions")
    class ActionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    LANES_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    lanes: Tensor
    counts: Tensor
    actions: _containers.MessageMap[str, Tensor]
    def __init__(self, lanes: _Optional[_Union[Tensor, _Mapping]] = ..., counts: _Optional[_Union[Tensor, _Mapping]] = ..., actions: _Optional[_Mapping[str, Tensor]] = ...) -> None: ...

class ResultBatch(_message.Message):
    __slots__ = ("lanes", "steps", "rows", "rewards", "terminated", "truncated", "observation", "info", "info_present", "info_rows")
    class ObservationEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class InfoEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    class InfoPresentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Tensor
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...
    LANES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    INFO_PRESENT_FIELD_NUMBER: _ClassVar[int]
    INFO_ROWS_FIELD_NUMBER: _ClassVar[int]
    lanes: Tensor
    steps: Tensor
    rows: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    observation: _containers.MessageMap[str, Tensor]
    info: _containers.MessageMap[str, Tensor]
    info_present: _containers.MessageMap[str, Tensor]
    info_rows: Tensor
    def __init__(self, lanes: _Optional[_Union[Tensor, _Mapping]] = ..., steps: _Optional[_Union[Tensor, _Mapping]] = ..., rows: _Optional[_Union[Tensor, _Mapping]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., observation: _Optional[_Mapping[str, Tensor]] = ..., info: _Optional[_Mapping[str, Tensor]] = ..., info_present: _Optional[_Mapping[str, Tensor]] = ..., info_rows: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("lane_mask", "resets", "observation_keys", "info_keys", "all_observations", "call_id", "batch", "release", "info_every_step")
    LANE_MASK_FIELD_NUMBER: _ClassVar[int]
    RESETS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_KEYS_FIELD_NUMBER: _ClassVar[int]
    INFO_KEYS_FIELD_NUMBER: _ClassVar[int]
    ALL_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    INFO_EVERY_STEP_FIELD_NUMBER: _ClassVar[int]
    lane_mask: _containers.RepeatedScalarFieldContainer[bool]
    resets: _containers.RepeatedCompositeFieldContainer[LaneReset]
    observation_keys: _containers.RepeatedScalarFieldContainer[str]
    info_keys: _containers.RepeatedScalarFieldContainer[str]
    all_observations: bool
    call_id: int
    batch: ActionBatch
    release: _containers.RepeatedScalarFieldContainer[int]
    info_every_step: bool
    def __init__(self, lane_mask: _Optional[_Iterable[bool]] = ..., resets: _Optional[_Iterable[_Union[LaneReset, _Mapping]]] = ..., observation_keys: _Optional[_Iterable[str]] = ..., info_keys: _Optional[_Iterable[str]] = ..., all_observations: _Optional[bool] = ..., call_id: _Optional[int] = ..., batch: _Optional[_Union[ActionBatch, _Mapping]] = ..., release: _Optional[_Iterable[int]] = ..., info_every_step: _Optional[bool] = ...) -> None: ...

class StepReply(_message.Message):
    __slots__ = ("server_step_seconds", "call_id", "batch")
    SERVER_STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    server_step_seconds: float
    call_id: int
    batch: ResultBatch
    def __init__(self, server_step_seconds: _Optional[float] = ..., call_id: _Optional[int] = ..., batch: _Optional[_Union[ResultBatch, _Mapping]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ShutdownReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
