"""Shared test setup: a fresh runtime for every test, and GPU tests skipped (with the reason)
only where wgpu finds no adapter at all."""
from __future__ import annotations

import functools
import os
import shutil
import tempfile

import pytest

_CACHE_DIR = None


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a WebGPU adapter (lavapipe counts); skipped when there is none")
    # the offline cache of compiled kernels goes to a folder of this session (so later tests hit
    # entries earlier ones wrote), never to the user's ~/.cache
    global _CACHE_DIR
    _CACHE_DIR = tempfile.mkdtemp(prefix="wgpu_ad_test_cache_")
    os.environ["WGPU_AD_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config):
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def no_adapter_reason() -> str | None:
    """None when an adapter exists, else why GPU tests are skipped (with what to install)."""
    from wgpu_ad.errors import GpuError
    from wgpu_ad.runtime import adapter

    try:
        if adapter.enumerate_adapters():
            return None
    except GpuError as e:
        return f"no WebGPU adapter: {e}"
    return "no WebGPU adapter.\n" + adapter.install_instructions()


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = no_adapter_reason()
    if reason:
        skip = pytest.mark.skip(reason=reason)
        for it in gpu_items:
            it.add_marker(skip)


@pytest.fixture(autouse=True)
def fresh_runtime():
    """Each test starts like a new program: no device, no fields, no compiled kernels (ti.reset)."""
    import wgpu_ad

    wgpu_ad.reset()
    yield
    wgpu_ad.reset()


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium for the browser tests (tests/browser_env.py), or None where there is
    none (those tests then skip, or fail under WGPU_AD_REQUIRE_BROWSER=1)."""
    import browser_env
    if browser_env.chromium_skip_reason():
        yield None
        return
    with browser_env.Chromium() as browser:
        yield browser
