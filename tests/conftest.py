"""Shared fixtures: the simulated NVML driver (see tests/support/simnvml.py); and the order in
which the test files reach the two xdist workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import simnvml as _sim

# The file that compiles DeepSpeed's CPU communication op on a fresh machine (minutes of one
# worker), then the other end-to-end files, which wait on real processes for most of their time.
_FIRST = ("tests/e2e/test_frameworks_deepspeed.py",)
_LONG = "tests/e2e/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files go first. `--dist loadfile` hands whole files to the two workers in
    collection order (pyproject's `--no-loadscope-reorder` keeps it; by default xdist would send
    the files with the fewest tests, the long single-run ones, last), so a long file started last
    runs alone at the end while the other worker idles. Started first, the long files overlap
    each other and the many short unit-test files fill in behind them. Each file's tests stay
    together and in their own order."""

    def rank(item: pytest.Item) -> int:
        path = Path(str(item.path)).relative_to(config.rootpath).as_posix()
        return 0 if path in _FIRST else 1 if path.startswith(_LONG) else 2

    items.sort(key=rank)  # stable: the order within each rank is the collection order


@pytest.fixture(scope="session")
def _simnvml_builds(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Sequence[str]], Path]:
    """Builds the library once per variant (set of missing functions) per test session."""
    cache: dict[frozenset[str], Path] = {}

    def get(missing: Sequence[str]) -> Path:
        key = frozenset(missing)
        if key not in cache:
            if not _sim.have_gcc():
                pytest.skip(
                    "gcc not found: the simulated NVML driver (tests/support/simnvml.c) "
                    "is compiled with gcc; install gcc to run the GPU tests"
                )
            cache[key] = _sim.build(tmp_path_factory.mktemp("simnvml-lib"), missing=sorted(key))
        return cache[key]

    return get


@pytest.fixture
def simnvml(
    _simnvml_builds: Callable[[Sequence[str]], Path], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., _sim.SimNVML]:
    """Factory: ``sim = simnvml(gpus=8)``; ``simnvml(gpus=[...], init_error="driver_not_loaded",
    missing=("nvmlDeviceGetMemoryInfo_v2",))``. Merge ``sim.env`` into a subprocess's environment,
    or use ``with sim.in_process():`` for this interpreter. ``sim.update(...)`` changes it live."""

    def make(
        gpus: int | Sequence[_sim.SimGPU] = 1,
        *,
        init_error: str | int | None = None,
        missing: Sequence[str] = (),
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
    ) -> _sim.SimNVML:
        lib = _simnvml_builds(missing)
        conf_dir = tmp_path_factory.mktemp("simnvml-conf")
        return _sim.SimNVML(
            lib,
            conf_dir / "simnvml.conf",
            gpus,
            init_error=init_error,
            driver_version=driver_version,
            cuda_version=cuda_version,
        )

    return make


@pytest.fixture
def simnvml_gpu() -> type[_sim.SimGPU]:
    """``simnvml_gpu(model="H100", util_gpu=50, processes=[SimProcess(pid, 1024)])``."""
    return _sim.SimGPU


@pytest.fixture(autouse=True)
def _terminal_size_of_the_test_run() -> Iterator[None]:
    """A Textual test puts COLUMNS/LINES into os.environ and leaves them there; every later
    subprocess in this worker would inherit a width it never asked for (a piped `xl runs`
    fits COLUMNS). Each test ends with the two as the run began."""
    before = {k: os.environ.get(k) for k in ("COLUMNS", "LINES")}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
