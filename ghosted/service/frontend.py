"""The app's one backend: everything its pages use from the library, named in one module.

The pages (``pages/*.py``, helpers included) import from ``ghosted`` only this module (or the session API),
a rule of ``tests/unit/project/test_layout.py``. What they compute goes through typed requests
(``workbench``) and the job queue (``jobs``); what is left here are the facts a page shows (a model's
layers and width, a method's help, the criteria's table) and the few actions that are not heavy jobs
(loading the cached model, saving a variant on a workstation).
"""

from ghosted.core import eventlog, heap
from ghosted.core.progress import Progress
from ghosted.data.sources import SourceUnavailableError, TextSource
from ghosted.evaluation.intervals import IntervalConfig
from ghosted.evaluation.zeroshot import parse_tasks
from ghosted.service import comparison, lessons, links, precompute, probes, recipes, workbench
from ghosted.service.cost import admit
from ghosted.service.deploy import DeployConfig, from_env
from ghosted.service.jobs import JobQueue, JobStatus
from ghosted.experiments.spec import offered_range, setting_choices
from ghosted.experiments.spec_flags import command
from ghosted.models.architecture import describe, hidden_size, num_layers, removed_share
from ghosted.models.assets import BUNDLED_MODEL
from ghosted.models.loading import (LoadedModel, ModelLoadError, available_devices, gpu_count, release_gpu_cache,
                                    versions)
from ghosted.models.pruning import format_layers
from ghosted.operators.checkpoint import load_any, save_recovered
from ghosted.recovery.diagnostics import removed_shares
from ghosted.recovery.fitting import METHODS
from ghosted.recovery.methods import RECOVERY, help_text, label_of, with_role
from ghosted.selection.criteria import CRITERIA, RECOVERABILITY

__all__ = ["BUNDLED_MODEL", "CRITERIA", "DeployConfig", "IntervalConfig", "JobQueue", "JobStatus", "LoadedModel",
           "METHODS", "admit", "ModelLoadError", "Progress", "RECOVERABILITY", "RECOVERY", "SourceUnavailableError",
           "TextSource", "available_devices", "command", "comparison", "describe", "eventlog", "format_layers",
           "from_env", "gpu_count", "heap", "help_text", "hidden_size", "label_of", "lessons", "links", "load_any",
           "num_layers", "offered_range", "parse_tasks", "precompute", "probes", "recipes", "release_gpu_cache",
           "removed_share", "removed_shares", "save_recovered", "setting_choices", "versions", "with_role", "workbench"]
