"""xl.doctor — its role and layer: docs/architecture.md."""

if __name__ != "xl.doctor":  # pragma: no cover - keeps out the double import this layout allows
    raise ImportError(
        f"this folder is the package 'xl.doctor'; import it as 'xl.doctor', not '{__name__}'"
    )
