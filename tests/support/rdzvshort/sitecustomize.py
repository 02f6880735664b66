"""On the PYTHONPATH of one test "node": torchrun's c10d rendezvous client gives up sooner.

torchrun's c10d client gives up on node 0's store after ``read_timeout`` (torch's default 60 s;
xl sets ``--rdzv-conf`` itself and leaves it so). A test that proves node 1 waits for a late node
0 needs node 0 later than that: with this folder on node 1's PYTHONPATH and
``XL_TEST_RDZV_READ_TIMEOUT=S``, torchrun there takes S seconds as that default instead, so node 0
need only be S seconds late, not minutes. torch reads the option only from ``--rdzv-conf``: this
wraps the c10d backend's ``_create_tcp_store`` when torchrun imports it (nothing else here imports
it), and appends ``read_timeout=S pid=P`` to ``XL_TEST_RDZV_READ_TIMEOUT_LOG`` for the test to
check: a torch whose code moved fails the test rather than proving less.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_MODULE = "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend"
_SECONDS = os.environ.get("XL_TEST_RDZV_READ_TIMEOUT", "")
_LOG = os.environ.get("XL_TEST_RDZV_READ_TIMEOUT_LOG", "")


def _shorten(module: ModuleType) -> None:
    create: Callable[[Any], Any] = module._create_tcp_store

    def create_tcp_store(params: Any) -> Any:
        params.config.setdefault("read_timeout", _SECONDS)
        if _LOG:
            with open(_LOG, "a", encoding="utf-8") as fh:
                fh.write(f"read_timeout={params.config['read_timeout']} pid={os.getpid()}\n")
        return create(params)

    module._create_tcp_store = create_tcp_store


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE:
            return None
        sys.meta_path.remove(self)  # the real finders from here on
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if spec is None or loader is None:
            return spec
        load = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            _shorten(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _SECONDS.isdigit() and int(_SECONDS) > 0:
    sys.meta_path.insert(0, _Finder())
