"""xl.launcher — its role and layer: docs/architecture.md."""

if __name__ != "xl.launcher":  # pragma: no cover - guards the double-import trap of this layout
    raise ImportError(
        f"this folder is the package 'xl.launcher'; import it as 'xl.launcher', not '{__name__}'"
    )
