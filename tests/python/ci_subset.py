"""CI's subset of a sweep (conftest.py skips what is marked `full` unless
METAMEM_FULL_TESTS=1)."""

import pytest

full = pytest.mark.full


def one_gpu_each(gpus, cases):
    """(gpu, *case) parameters for every GPU and case (a case is a value or a
    tuple of them). In CI, case i runs on gpus[i % len(gpus)] alone, so that
    each case and each GPU runs."""
    return [pytest.param(gpu, *(case if isinstance(case, tuple) else (case,)),
                         marks=() if g == i % len(gpus) else full)
            for i, case in enumerate(cases) for g, gpu in enumerate(gpus)]


def one_in(n, cases):
    """Every case as a parameter; in CI, every n-th alone (the first among them)."""
    return [pytest.param(case, marks=() if i % n == 0 else full) for i, case in enumerate(cases)]
