"""Typed configuration: ``configs/*.yaml`` -> nested pydantic dataclasses, validated at load.

``schema`` (the sections, each key's default, range and help), ``load`` (YAML and overrides -> a
``Config``, errors naming the key path), ``show`` (``escrag config show``) and ``paths`` (the run
folder's layout). The names callers use are re-exported here: ``from escrag.config import Config,
load_config``.
"""

from escrag.config.load import from_dict, load_config, output_path, to_dict
from escrag.config.paths import RunPaths, run_paths
from escrag.config.schema import (
    Bool,
    Config,
    ConfigError,
    CounselorConfig,
    DataConfig,
    EndpointConfig,
    EvalConfig,
    EvalRowConfig,
    EvalSystemConfig,
    Float,
    GrpoConfig,
    GuardConfig,
    HumanConfig,
    Int,
    JudgeConfig,
    Key,
    LabelsConfig,
    LoraConfig,
    OpenRLHFConfig,
    PlacementConfig,
    PolicyConfig,
    PrefsConfig,
    ProxyConfig,
    RayConfig,
    RetrieverConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SafetyConfig,
    SftConfig,
    Str,
    option,
    section,
    subsection,
)
