"""NCCL's InfiniBand and network-plugin variables against what NCCL will really use: the HCAs in
/sys/class/infiniband with an ACTIVE port, and a plugin library the loader can find. NCCL does not
stop on either; it falls back to TCP sockets (or its own transports) without a word, which is
what these rules say."""

from __future__ import annotations

from xl.doctor.facts import Facts


def _items(spec: str) -> tuple[bool, bool, list[tuple[str, str | None]]]:
    """NCCL_IB_HCA as NCCL reads it: `^` excludes, `=` matches names exactly (else prefixes),
    comma-separated `name[:port]` items."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    spec = spec.lstrip("=")
    out = []
    for item in spec.split(","):
        name, _, port = item.strip().partition(":")
        if name:
            out.append((name, port or None))
    return exclude, exact, out


def _active(f: Facts, dev: str, port: str | None) -> bool:
    ports = f.ib_ports.get(dev, {})
    if port is not None:
        return ports.get(port) == "ACTIVE"
    return any(state == "ACTIVE" for state in ports.values())


def _listing(f: Facts) -> str:
    devs = f.ib_devices or []
    return ", ".join(
        f"{d} ({'active' if _active(f, d, None) else 'no active port'})" for d in devs[:8]
    )


def ib_hca(f: Facts) -> tuple[str, str, bool] | None:
    """(what is wrong, its fix, whether NCCL stops) for NCCL_IB_HCA naming HCAs NCCL won't use."""
    value = f.env.get("NCCL_IB_HCA")
    if (
        not value
        or not value.strip()
        or f.ib_devices is None
        or f.env.get("NCCL_IB_DISABLE") == "1"
    ):
        return None
    want_ib = (f.env.get("NCCL_NET") or "").strip().upper() == "IB"
    if not f.ib_devices:
        if want_ib:
            return None  # NCCL_NET=IB without any device: the rule before this one says it
        return (
            f"NCCL_IB_HCA={value} but this node has no InfiniBand or RoCE device "
            "(/sys/class/infiniband is empty): "
            "NCCL uses TCP sockets",
            "unset NCCL_IB_HCA",
            False,
        )
    exclude, exact, items = _items(value)

    def hits(name: str, port: str | None) -> list[str]:
        return [
            d
            for d in f.ib_devices or []
            if (d == name if exact else d.startswith(name)) and _active(f, d, port)
        ]

    if exclude:
        chosen = [
            d
            for d in f.ib_devices
            if _active(f, d, None)
            and not any((d == n if exact else d.startswith(n)) for n, _ in items)
        ]
        absent: list[str] = []
    else:
        chosen = sorted({d for n, p in items for d in hits(n, p)})
        absent = [n + (f":{p}" if p else "") for n, p in items if not hits(n, p)]
    if not chosen:
        stop = want_ib
        what = (
            'NCCL stops at init ("Failed to initialize any NET plugin")'
            if stop
            else "NCCL falls back to TCP sockets without a word"
        )
        return (
            f"NCCL_IB_HCA={value} selects none of this node's HCAs with an active port "
            f"({_listing(f)}): {what}; unset, NCCL uses every active HCA",
            "unset NCCL_IB_HCA",
            stop,
        )
    if absent:
        keep = [
            n + (f":{p}" if p else "") for n, p in items if n + (f":{p}" if p else "") not in absent
        ]
        prefix = "=" if exact else ""
        return (
            f"NCCL_IB_HCA={value} names {', '.join(absent)}, which this node does not have with an "
            "active port "
            f"({_listing(f)}): NCCL uses only {', '.join(chosen)}",
            f"export NCCL_IB_HCA={prefix}{','.join(keep)}",
            False,
        )
    return None


def net_plugin(f: Facts) -> tuple[str, str] | None:
    """(what is wrong, its fix) for NCCL_NET_PLUGIN naming a library the loader can't find."""
    value = (f.env.get("NCCL_NET_PLUGIN") or "").strip()
    if not value or value.lower() == "none" or f.nccl_plugin is None:
        return None
    name, found = f.nccl_plugin
    if found:
        return None
    return (
        f"NCCL_NET_PLUGIN={value}: NCCL looks for {name}, which the loader does not find "
        "(LD_LIBRARY_PATH, the "
        "ldconfig cache, /usr/lib): NCCL goes on with its own transports (without InfiniBand: TCP "
        "sockets) without a word",
        "unset NCCL_NET_PLUGIN",
    )
