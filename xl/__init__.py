"""xl: diagnose, launch and watch multi-GPU PyTorch training.

Training scripts use two names from here::

    import xl xl.log(step=step, loss=loss, samples=batch_size) xl.watch(model)

Everything is resolved lazily so that ``import xl`` inside a rank stays cheap and pulls in
neither Rich, Textual nor torch.
"""

from __future__ import annotations

from typing import Any

from xl._version import __version__

__all__ = ["__version__", "log", "watch"]


def __getattr__(name: str) -> Any:
    # The client (and its background thread) is only loaded when a script first uses it.
    if name in ("log", "watch", "flush"):
        from xl import client  # noqa: PLC0415 - starts the sender thread; `import xl` must stay cheap

        value = getattr(client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xl' has no attribute {name!r}")
