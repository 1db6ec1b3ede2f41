"""One small CPU resource pool for the controller tests (2 bundles of 0.3 CPU, 3 actors a bundle)."""

import pytest


@pytest.fixture(scope="session")
def cpu_pool(ray_local):
    from hybridrl.controller import RayResourcePool

    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=3, cpus_per_bundle=0.3, name_prefix="test_ctrl")
    yield pool
    pool.release()


@pytest.fixture(scope="module")
def ship_module_by_value(request, ray_local):
    """Ray workers cannot import pytest's test modules: ship this module's worker classes by value."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(request.module)
