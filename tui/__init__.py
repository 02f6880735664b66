"""xl.tui — its role and layer: docs/architecture.md."""

if __name__ != "xl.tui":  # pragma: no cover - guards the double-import trap of this layout
    raise ImportError(
        f"this folder is the package 'xl.tui'; import it as 'xl.tui', not '{__name__}'"
    )
