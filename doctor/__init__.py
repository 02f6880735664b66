"""xl.doctor — its role and layer: docs/architecture.md."""

if __name__ != "xl.doctor":  # pragma: no cover - guards the double-import trap of this layout
    raise ImportError(
        f"this folder is the package 'xl.doctor'; import it as 'xl.doctor', not '{__name__}'"
    )
