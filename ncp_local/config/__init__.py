"""The resolved Hydra config as typed, validated records.

Validation happens here, before any spec or model loads; every error names
the config field. Run identity (the hash that names the run directory)
comes from the settings that change results, not from bookkeeping ones.

The package face: `schema` holds the run config and its validation, `sections` the records it is made
of, `identity_keys` which keys enter a run's identity, `composer` the Hydra composition outside
`hydra.main`.
"""

from .composer import REPO_ROOT, bounded, compose, hydra_error_line, override_error_line
from .identity_keys import LATER_KEYS, NOT_IDENTITY
from .schema import ConfigError, RunConfig, dataset_path, validate
from .sections import (
    ENGINES,
    SCRIPTED,
    TRACKERS,
    AuditCfg,
    BenchCfg,
    DatasetCfg,
    EndpointCfg,
    EngineCfg,
    EngineName,
    ExportCfg,
    OpenAIEngineCfg,
    PlanCfg,
    ReportCfg,
    ReviewCfg,
    RoleCfg,
    ScriptedEngineCfg,
    ShardCfg,
    TrackerCfg,
    TrialsCfg,
    VLLMEngineCfg,
)

__all__ = [
    "ENGINES",
    "LATER_KEYS",
    "NOT_IDENTITY",
    "REPO_ROOT",
    "SCRIPTED",
    "TRACKERS",
    "AuditCfg",
    "BenchCfg",
    "ConfigError",
    "DatasetCfg",
    "EndpointCfg",
    "EngineCfg",
    "EngineName",
    "ExportCfg",
    "OpenAIEngineCfg",
    "PlanCfg",
    "ReportCfg",
    "ReviewCfg",
    "RoleCfg",
    "RunConfig",
    "ScriptedEngineCfg",
    "ShardCfg",
    "TrackerCfg",
    "TrialsCfg",
    "VLLMEngineCfg",
    "bounded",
    "compose",
    "dataset_path",
    "hydra_error_line",
    "override_error_line",
    "validate",
]
