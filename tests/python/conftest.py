"""CI runs a subset of the long sweeps and of the compile-heavy tests, so that a
clean clone's tests finish in CI's time. A test or case marked `full` runs
only where METAMEM_FULL_TESTS=1 (docs/setup.md); elsewhere it is skipped and
says why. Marks and subsets of sweeps: ci_subset.py."""

import os

import pytest

FULL_SUITE = os.environ.get("METAMEM_FULL_TESTS") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "full: outside CI's subset; METAMEM_FULL_TESTS=1 runs it")


def pytest_collection_modifyitems(config, items):
    if FULL_SUITE:
        return
    skip = pytest.mark.skip(reason="outside CI's subset: METAMEM_FULL_TESTS=1 runs it")
    for item in items:
        if item.get_closest_marker("full"):
            item.add_marker(skip)
