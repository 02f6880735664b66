"""The supervisor's telemetry: collector, sampler, log parsing and the diagnoses made from them.

Here too: collector.json, the collector's counts and where it listens (docs/contracts.md, "The
run directory"), read into a ``CollectorStatus`` and written from one by these functions only.
They live in the package itself, with the run dir's own modules as their only imports, because
the supervisor reads the port an earlier collector of the run listened on before it imports
telemetry (launcher/supervisor/safe_telemetry.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from xl.atomic import write_json_atomic
from xl.launcher.rundir.layout import RunLayout
from xl.launcher.rundir.runrecord import read_object


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class CollectorStatus:
    """collector.json: where the collector listens (``host``, ``port``, ``address``: what ranks
    dial), its supervisor, when it was written, and the counts docs/contracts.md lists."""

    host: str = ""
    port: int = 0  # 0: none known
    supervisor_pid: int = 0
    updated: float = 0.0
    address: str = ""
    frames: int = 0
    records: int = 0
    node_frames: int = 0
    rank_peers: int = 0
    duplicate_frames: int = 0
    rejects: Mapping[str, int] = field(default_factory=dict)
    spooled_records: int = 0
    unparsed_lines: int = 0
    printed_before_training: int = 0
    metrics_bytes_lost: int = 0

    # edge: collector.json's object as the file holds it
    @classmethod
    def from_json(cls, obj: Mapping[str, object]) -> CollectorStatus:
        """What ``obj`` says; a key missing or of another type reads as none (0, "")."""
        host, address, updated = obj.get("host"), obj.get("address"), obj.get("updated")
        port = _count(obj.get("port"))
        rejects = obj.get("rejects")
        return cls(
            host=host if isinstance(host, str) else "",
            port=port if 0 < port < 65536 else 0,
            supervisor_pid=_count(obj.get("supervisor_pid")),
            updated=float(updated) if isinstance(updated, (int, float)) else 0.0,
            address=address if isinstance(address, str) else "",
            frames=_count(obj.get("frames")),
            records=_count(obj.get("records")),
            node_frames=_count(obj.get("node_frames")),
            rank_peers=_count(obj.get("rank_peers")),
            duplicate_frames=_count(obj.get("duplicate_frames")),
            rejects=(
                {str(k): _count(v) for k, v in rejects.items()}
                if isinstance(rejects, Mapping)
                else {}
            ),
            spooled_records=_count(obj.get("spooled_records")),
            unparsed_lines=_count(obj.get("unparsed_lines")),
            printed_before_training=_count(obj.get("printed_before_training")),
            metrics_bytes_lost=_count(obj.get("metrics_bytes_lost")),
        )

    def to_json(self) -> dict[str, object]:
        """collector.json's object, its keys in the file's order."""
        return {
            "host": self.host,
            "port": self.port,
            "supervisor_pid": self.supervisor_pid,
            "updated": self.updated,
            "address": self.address,
            "frames": self.frames,
            "records": self.records,
            "node_frames": self.node_frames,
            "rank_peers": self.rank_peers,
            "duplicate_frames": self.duplicate_frames,
            "rejects": dict(self.rejects),
            "spooled_records": self.spooled_records,
            "unparsed_lines": self.unparsed_lines,
            "printed_before_training": self.printed_before_training,
            "metrics_bytes_lost": self.metrics_bytes_lost,
        }


def read_collector_json(run_dir: Path) -> CollectorStatus | None:
    """collector.json; None while it is missing, damaged or mid-replace."""
    obj = read_object(RunLayout(run_dir).collector)
    return CollectorStatus.from_json(obj) if obj is not None else None


def write_collector_json(run_dir: Path, status: CollectorStatus) -> None:
    write_json_atomic(RunLayout(run_dir).collector, status.to_json())


def previous_port(run_dir: Path) -> int:
    """The port an earlier collector of the run listened on, as its ranks know it; 0 for none."""
    status = read_collector_json(run_dir)
    return status.port if status is not None else 0
