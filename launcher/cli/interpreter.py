"""`xl launch --python PY`: run the ranks under another environment's interpreter.

torchrun and every rank then run as ``PY -m torch.distributed.run ... -m xl.launcher.entry``, so
PY needs torch; xl need not be installed there. What the ranks need of xl (the rank entry, and
``xl.log`` / ``xl.watch`` for scripts that call them) is standard library only, so it reaches
them through PYTHONPATH: a small ``xl`` package under ``$XL_HOME/pyshim/<hash>/`` whose
``__init__`` runs this xl's own and points its ``__path__`` at this xl's folders (with the
checkout's layout, ``xl.launcher`` lives in ``launcher/``, next to ``xl/``). PY must be
Python 3.10 or newer, like xl; PYTHONPATH the person set is kept after it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from xl import paths
from xl.atomic import write_atomic
from xl.errors import UsageError
from xl.python_arg import find_python

_INIT = '''"""Written by `xl launch --python`: the xl that launched this run, for ranks whose
interpreter has no xl of its own (see xl.launcher.cli.interpreter)."""
__path__ = {path!r}
with open({init!r}, encoding="utf-8") as _f:
    exec(compile(_f.read(), {init!r}, "exec"))
'''


def resolve_python(python: str) -> str:
    """``--python PY`` as an absolute path to an executable (the rule `xl doctor --python` follows
    too: xl.python_arg); UsageError (one line) if none."""
    found, _ = find_python(python)
    if found is None:
        raise UsageError(
            f"--python {python}: no such interpreter (give the path of another environment's "
            "python, e.g. --python ~/envs/torch/bin/python)"
        )
    return os.path.abspath(found)


def _xl_folders() -> tuple[Path, dict[str, Path]]:
    """This xl's package folder, and the subpackages that live outside it (checkout layout)."""
    import xl  # noqa: PLC0415 - only to find where this xl is
    import xl.launcher  # noqa: PLC0415 - as above

    home = Path(xl.__file__).resolve().parent
    launcher = Path(xl.launcher.__file__).resolve().parent
    outside = {} if launcher == home / "launcher" else {"launcher": launcher}
    return home, outside


def shim_dir(*, create: bool = True) -> Path:
    """The folder to put on the ranks' PYTHONPATH (made once per xl location; ``create=False``
    only names it, for --dry-run)."""
    home, outside = _xl_folders()
    key = hashlib.sha256(f"{home}|{sorted(outside.items())}".encode()).hexdigest()[:12]
    root = paths.xl_home() / "pyshim" / key
    parts = root / "parts"
    init = root / "xl" / "__init__.py"
    if create and not init.is_file():
        parts.mkdir(parents=True, exist_ok=True)
        for name, target in outside.items():
            link = parts / name
            if not link.exists():
                tmp = parts / f".{name}.{os.getpid()}"
                tmp.symlink_to(target, target_is_directory=True)
                os.replace(tmp, link)
        init.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(
            init, _INIT.format(path=[str(home), str(parts)], init=str(home / "__init__.py"))
        )
    return root


def ranks_pythonpath(existing: str | None, *, create: bool = True) -> str:
    """PYTHONPATH for torchrun and the ranks under --python: the shim first, then the person's."""
    return os.pathsep.join(p for p in (str(shim_dir(create=create)), existing or "") if p)
