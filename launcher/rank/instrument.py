"""Per-rank figures from unchanged scripts: the known frameworks are instrumented when imported.

The rank entry calls ``install()`` before the user's code runs. It puts one finder at the front
of ``sys.meta_path`` that answers for a handful of module names only (``HOOKS``); when the script
imports one of them, the module is loaded exactly as it would be, and then the matching
``xl.integrations`` function patches it (torch's optimizer, backward and DataLoader hooks, a
Trainer callback, a Lightning callback, Accelerate's backward, DeepSpeed's engine step) so that
every rank logs its own step, loss and samples.

Nothing is imported ahead of the script: a script that never imports transformers pays a dict
lookup per import. Nothing the frameworks print changes. A patch that fails leaves the module as
it was (the run goes on, its figures come from the log parser). ``XL_INSTRUMENT=0``
(``xl launch --no-instrument``) turns it all off. docs/frameworks.md says what each one logs.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from xl import envnames

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

# The finder and loader below are duck-typed (find_spec; create_module, exec_module): importlib.abc
# would load importlib.resources into every rank before the script, ~20 ms for two base classes.

# module whose import is watched -> the xl.integrations module whose instrument(module) patches it
HOOKS = {
    # torch itself, once its __init__ is done (it loads torch.optim, nn, utils.data, distributed
    # and amp on the way): plain loops' steps, loss, samples and time split.
    "torch": "xl.integrations.torchsteps",
    "transformers.trainer": "xl.integrations.transformers",
    "pytorch_lightning.trainer.trainer": "xl.integrations.lightning",
    "lightning.pytorch.trainer.trainer": "xl.integrations.lightning",
    "accelerate.accelerator": "xl.integrations.accelerate",
    "deepspeed.runtime.engine": "xl.integrations.deepspeed",
}


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Inside an xl run (a collector to send to) and not turned off with XL_INSTRUMENT=0."""
    env = os.environ if env is None else env
    if not env.get(envnames.COLLECTOR):
        return False
    return env.get(envnames.INSTRUMENT, "1").strip() not in ("0", "no", "false")


def patch(name: str, module: ModuleType) -> None:
    """Run the integration for ``name`` on the module just loaded; never raises into the import."""
    try:
        integration = importlib.import_module(HOOKS[name])
        integration.instrument(module)
    except Exception:  # a framework version we do not know: the module stays as it was
        pass


class _Loader:
    """The module's own loader, then the patch; the module keeps its own loader afterwards."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Anything that later asks the module for its loader (resources, reload) gets the real one.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        patch(self._name, module)


class _Finder:
    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in HOOKS or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            # The finders after this one find it as they would have: the same spec, our loader.
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)  # type: ignore[assignment]
        return spec


def install() -> bool:
    """Watch the frameworks' imports in this rank (once); True when instrumentation is on."""
    if not enabled():
        return False
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())  # type: ignore[arg-type]
    for name in HOOKS:  # imported before the script ran (a sitecustomize): patched now
        module = sys.modules.get(name)
        if module is not None:
            patch(name, module)
    return True
