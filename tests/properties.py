"""Shared settings of the property and fuzz tests: a fixed, reproducible number of examples per test, a
memory bound on every call, and the errors a parser may answer with.

CI runs exactly ``sum(EXAMPLES.values())`` generated examples (``derandomize=True``: the same ones on
every run, so a failure reproduces); ``tests/unit/project/test_properties_budget.py`` checks the sum.
"""

from __future__ import annotations

import resource
from contextlib import contextmanager

from hypothesis import HealthCheck, settings

EXAMPLES = {  # test name -> examples CI runs (fixed: the CI cost stays what it is today)
    "drop_spec_text": 300, "drop_spec_within_a_model": 200, "drop_spec_lists": 150,
    "spec_dict_any_json": 200, "spec_dict_one_leaf_changed": 300, "spec_file_mutated": 120, "cli_recipe_mutated": 25,
    "folder_recipe_mutated": 40, "folder_operators_crafted": 40, "folder_weights_mutated": 25,
    "folder_paths": 25, "headers_mutated": 150, "window_counts": 200, "gap_text": 200,
    "cost_grows_with_every_lever": 150, "cost_against_measured_peak": 4, "layerwise_checkpoint_mutated": 40,
}
MEMORY_MB = 512  # what one parse may add to the process's address space (a 10**11-layer range needs ~4 TB)


def examples(name: str, **overrides) -> settings:
    """Hypothesis settings for the test ``name``: its fixed example count, derandomized, no deadline (the
    memory bound and the parsers' own bounds keep each example short; no timing is asserted)."""
    return settings(max_examples=EXAMPLES[name], derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much],
                    **overrides)


def _address_space() -> int:
    """This process's address space now, in bytes (Linux: /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


@contextmanager
def bounded_memory(mb: int = MEMORY_MB):
    """Run the body with at most ``mb`` more address space: an allocation beyond it is a MemoryError
    (a failed property) instead of a machine that swaps or a process the kernel kills."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _address_space() + mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def assert_refusal(err: BaseException, allowed: tuple[type[BaseException], ...]) -> None:
    """A documented refusal: one of ``allowed``, with a message (never an empty or a bare-key error)."""
    assert isinstance(err, allowed), f"{type(err).__name__}: {err}"
    assert len(str(err).strip()) > 10, f"{type(err).__name__} without a message: {err!r}"
