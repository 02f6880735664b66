"""The GPU's, NCCL's and shared memory's causes: what torch's allocator, the CUDA runtime, NCCL
and the DataLoader's shared memory said, with the doctor's facts and fixes (docs/launch.md, "Why
a rank died")."""

from __future__ import annotations

from xl.launcher.causes import host, words
from xl.launcher.causes.doctor_facts import Doctor
from xl.launcher.causes.evidence import Evidence, cause, rerun
from xl.launcher.rundir.outcome import Cause


def gpu_cause(found: words.Found, ev: Evidence, doctor: Doctor, signal: str | None) -> Cause:
    """The cause of a GPU, NCCL or shared-memory kind; ``signal``: the signal that followed
    (an abort after the message), named in the summary."""
    f = found.facts
    by = f" (then {signal})" if signal else ""
    if found.kind == "cuda_oom":
        return _cuda_oom(found, ev)
    if found.kind == "shm_full":
        return shm_cause(found, doctor)
    if found.kind == "no_kernel_image":
        for check in ("torch", "arch_list"):
            answer = doctor.ask(check)
            if answer.status in ("fail", "warn") and answer.fix:
                return cause(
                    found, answer.detail, answer.fix, [f"xl doctor ({check}): {answer.detail}"]
                )
        return cause(found, "the GPU has no kernel of this build for its architecture", None)
    if found.kind == "device_busy":
        answer = doctor.ask("gpus")
        if answer.status in ("fail", "warn") and answer.fix:
            return cause(
                found,
                f"the GPU is busy or unavailable: {answer.detail}",
                answer.fix,
                [f"xl doctor (gpus): {answer.detail}"],
            )
        return cause(
            found,
            "the GPU is busy or unavailable (exclusive-process mode held by another process, or "
            "Prohibited)",
            "nvidia-smi -q -d COMPUTE,PIDS",
        )
    if found.kind == "collective_timeout":
        op = f"{f.get('op', 'a collective')}" + (f" #{f['seq']}" if "seq" in f else "")
        summary = f"{op} timed out after {f.get('timeout_s', '?')} s{by}"
        if ev.hang:
            summary += f"; xl's hang verdict: {ev.hang}"
        return cause(found, summary, None)
    if found.kind == "nccl_error":
        what = f.get("what") or "error"
        summary = (
            f"NCCL {what}"
            + (f" ({f['code']})" if "code" in f else "")
            + (f": {f['last']}" if "last" in f else "")
            + by
        )
        answer = doctor.ask("nccl")
        facts = _network_facts(doctor)
        if answer.status in ("fail", "warn") and answer.fix:
            return cause(found, f"{summary}; xl doctor: {answer.detail}", answer.fix, facts)
        return cause(found, summary, rerun(ev, "NCCL_DEBUG=INFO"), facts)
    what = f.get("what", "?")
    if "assert" in f:
        return cause(
            found,
            f"a device-side assert failed{by}: {f.get('assertion', what)}",
            rerun(ev, "CUDA_LAUNCH_BLOCKING=1"),
        )
    return cause(
        found,
        f"CUDA error: {what}{by}",
        rerun(ev, "CUDA_LAUNCH_BLOCKING=1") if "launch" in what else None,
    )


def _cuda_oom(found: words.Found, ev: Evidence) -> Cause:
    f = found.facts
    if "asked" not in f:  # the CUDA runtime's own word (a context, cuBLAS, NCCL's buffers)
        return cause(
            found,
            f"the GPU ran out of memory outside PyTorch's allocator: {found.evidence[0][:200]}",
            "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
        )
    summary = f"CUDA out of memory: asked for {f['asked']}"
    if "gpu" in f:
        summary = (
            f"GPU {f['gpu']} out of memory: asked for {f['asked']} with {f['free']} free of "
            f"{f['total']}"
        )
    slack = _bytes(f.get("unallocated"))
    if slack:
        summary += f"; {f['unallocated']} reserved by PyTorch but unallocated"
    if slack and slack >= (_bytes(f["asked"]) or 0):
        fix = rerun(ev, "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    else:
        fix = (
            "halve the per-GPU batch size and double the gradient accumulation steps (the same "
            "global batch), or checkpoint activations (torch.utils.checkpoint)"
        )
    return cause(found, summary, fix)


def _bytes(text: str | None) -> float | None:
    if not text:
        return None
    if text == "0 bytes":
        return 0.0
    number, unit = text.split()
    return float(number) * {
        "B": 1,
        "KiB": 1 << 10,
        "MiB": 1 << 20,
        "GiB": 1 << 30,
        "TiB": 1 << 40,
    }.get(unit, 1)


def shm_small(doctor: Doctor) -> bool:
    return doctor.ask("shm").status in ("warn", "fail")


def shm_cause(found: words.Found, doctor: Doctor) -> Cause:
    facts = doctor.facts()
    total, free = facts.shm_total, facts.shm_free
    size = f" ({host.size(total)}, {host.size(free or 0)} free now)" if total is not None else ""
    answer = doctor.ask("shm")
    fix = answer.fix or doctor.grow_shm()
    summary = (
        f"shared memory {facts.shm_path}{size} is too small: DataLoader workers hand batches over "
        "through it (fewer workers, or torch.multiprocessing.set_sharing_strategy('file_system') "
        "for many tensors, also help)"
    )
    return cause(
        found, summary, fix, [f"xl doctor (shm): {answer.detail}"] if answer.detail else []
    )


def _network_facts(doctor: Doctor) -> list[str]:
    facts = doctor.facts()
    said = []
    if facts.net_ifaces is not None:
        said.append(f"network interfaces: {', '.join(facts.net_ifaces) or 'none'}")
    if facts.ib_devices is not None:
        said.append(f"InfiniBand devices: {', '.join(facts.ib_devices) or 'none'}")
    nccl = {k: v for k, v in facts.env.items() if k.startswith("NCCL_")}
    if nccl:
        said.append("NCCL variables: " + " ".join(f"{k}={v}" for k, v in sorted(nccl.items())))
    return said
