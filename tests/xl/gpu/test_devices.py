"""The CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER resolver and find_gpu, as tables of cases."""

from __future__ import annotations

import pytest
from gpus import idle_gpu

from xl.gpu.devices import find_gpu, judge_visible_devices, resolve_visible_devices
from xl.gpu.inventory import GPU, LOST_MESSAGE, empty_gpu

UUIDS = (
    "GPU-aa11f00d-0000-4000-8000-000000000000",
    "GPU-aa22f00d-0000-4000-8000-000000000001",
    "GPU-bb33f00d-0000-4000-8000-000000000002",
    "GPU-1c44f00d-0000-4000-8000-000000000003",  # starts with a digit: the strtoul trap
)
BUSES = ("00000000:07:00.0", "00000000:0F:00.0", "00000000:47:00.0", "00000000:4E:00.0")


def gpu(index: int, cc: str = "8.0", uuid: str | None = None) -> GPU:
    return idle_gpu(index, cc=cc, uuid=UUIDS[index] if uuid is None else uuid, bus=BUSES[index])


SAME = [gpu(i) for i in range(4)]
# nvidia-smi order V100, A100, V100, H100: CUDA's fastest-first order is H100, A100, V100, V100
MIXED = [gpu(0, "7.0"), gpu(1, "8.0"), gpu(2, "7.0"), gpu(3, "9.0")]

# (id, gpus, env, nvidia-smi indices CUDA sees in cuda:0.. order, hides_all, words in problems)
CASES = [
    ("unset", SAME, {}, [0, 1, 2, 3], False, None),
    ("empty-hides-all", SAME, {"CUDA_VISIBLE_DEVICES": ""}, [], True, "hides every GPU"),
    ("minus-one-hides-all", SAME, {"CUDA_VISIBLE_DEVICES": "-1"}, [], True, "hides every GPU"),
    ("order-as-written", SAME, {"CUDA_VISIBLE_DEVICES": "2,0"}, [2, 0], False, None),
    ("whitespace", SAME, {"CUDA_VISIBLE_DEVICES": " 1 , 3"}, [1, 3], False, None),
    ("duplicate-empties", SAME, {"CUDA_VISIBLE_DEVICES": "0,1,0"}, [], True, "twice"),
    ("unknown-stops", SAME, {"CUDA_VISIBLE_DEVICES": "1,7,2"}, [1], False, "no GPU 7"),
    ("empty-entry-stops", SAME, {"CUDA_VISIBLE_DEVICES": "1,,2"}, [1], False, "empty entry"),
    ("negative-stops", SAME, {"CUDA_VISIBLE_DEVICES": "3,-1,0"}, [3], False, "ends the list"),
    ("strtoul", SAME, {"CUDA_VISIBLE_DEVICES": "1gpu2,2"}, [1, 2], False, "read by CUDA as"),
    ("word-stops", SAME, {"CUDA_VISIBLE_DEVICES": "0,cuda1"}, [0], False, "not a GPU index"),
    ("uuids", SAME, {"CUDA_VISIBLE_DEVICES": f"{UUIDS[2]},{UUIDS[0]}"}, [2, 0], False, None),
    ("uuid-prefix", SAME, {"CUDA_VISIBLE_DEVICES": "GPU-bb,GPU-aa22"}, [2, 1], False, None),
    ("uuid-prefix-ambiguous", SAME, {"CUDA_VISIBLE_DEVICES": "GPU-aa"}, [], True, "matches 2"),
    (
        "uuid-unknown-stops",
        SAME,
        {"CUDA_VISIBLE_DEVICES": "GPU-bb,GPU-ff,GPU-aa11"},
        [2],
        False,
        "no GPU has the UUID",
    ),
    ("uuid-then-index", SAME, {"CUDA_VISIBLE_DEVICES": "GPU-bb,1"}, [2], False, "mixed"),
    ("index-then-uuid", SAME, {"CUDA_VISIBLE_DEVICES": "1,GPU-bb"}, [1], False, "mixed"),
    ("uuid-duplicate", SAME, {"CUDA_VISIBLE_DEVICES": f"GPU-bb,{UUIDS[2]}"}, [], True, "twice"),
    (
        "uuid-without-prefix",
        SAME,
        {"CUDA_VISIBLE_DEVICES": UUIDS[3][4:]},
        [1],
        False,
        "needs the GPU- prefix",
    ),
    ("fastest-first", MIXED, {"CUDA_VISIBLE_DEVICES": "0,1"}, [3, 1], False, "nvidia-smi 3"),
    ("fastest-first-unset", MIXED, {}, [3, 1, 0, 2], False, "CUDA_DEVICE_ORDER=PCI_BUS_ID"),
    (
        "pci-bus-order",
        MIXED,
        {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1"},
        [0, 1],
        False,
        None,
    ),
    ("uuids-ignore-order", MIXED, {"CUDA_VISIBLE_DEVICES": "GPU-aa11"}, [0], False, None),
    (
        "bad-order-value",
        SAME,
        {"CUDA_DEVICE_ORDER": "pci"},
        [0, 1, 2, 3],
        False,
        "not a value CUDA knows",
    ),
    ("no-gpus", [], {"CUDA_VISIBLE_DEVICES": "0"}, [], True, "no GPU 0"),
]


@pytest.mark.parametrize(
    ("gpus", "env", "expected", "hides_all", "words"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_resolve_visible_devices(gpus, env, expected, hides_all, words):
    vis = resolve_visible_devices(gpus, env)
    assert [g.index for g in vis.devices] == expected
    assert vis.hides_all is hides_all
    if words is None:
        assert vis.problems == ()
    else:
        assert any(words in p for p in vis.problems), vis.problems


def test_mig_instances_are_reported_not_guessed():
    mig = "MIG-8d0f2b0c-4b7a-5b8e-9e3c-1c2d3e4f5a6b"
    vis = resolve_visible_devices(SAME, {"CUDA_VISIBLE_DEVICES": mig})
    assert vis.mig_ids == (mig,) and vis.devices == ()
    assert not vis.hides_all
    assert any("MIG" in p for p in vis.problems)


def test_order_differs_only_when_models_differ():
    assert resolve_visible_devices(MIXED, {}).order_differs
    assert not resolve_visible_devices(MIXED, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}).order_differs
    assert not resolve_visible_devices(SAME, {}).order_differs
    assert resolve_visible_devices(MIXED, {}).device_order == "FASTEST_FIRST"


@pytest.mark.parametrize(
    ("value", "invalid"),
    [
        ("0,1", False),
        ("", False),
        ("-1", False),
        ("0,7", True),
        ("1,1", True),
        ("GPU-aa", True),
        ("0,-1", True),
        ("1gpu2", False),
    ],
)
def test_invalid_flags_what_cuda_rejects(value, invalid):
    assert resolve_visible_devices(SAME, {"CUDA_VISIBLE_DEVICES": value}).invalid is invalid


def test_ignored_and_duplicates_are_listed():
    vis = resolve_visible_devices(SAME, {"CUDA_VISIBLE_DEVICES": "0,9,1,2"})
    assert vis.ignored == ("1", "2")
    assert resolve_visible_devices(SAME, {"CUDA_VISIBLE_DEVICES": "2,2"}).duplicates == ("2",)


LOST = empty_gpu(4, error=LOST_MESSAGE, lost=True)  # as NVML's sweep makes a GPU lost mid-way


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("2", 2),
        ("9", None),
        ("", None),
        ("  ", None),
        (UUIDS[1], 1),
        ("GPU-bb", 2),
        ("bb33", 2),  # without the GPU- prefix
        ("BB33F00D", 2),  # UUIDs are case-insensitive
        ("aa", None),  # ambiguous prefix
        ("GPU-", None),
        ("GPU-zz", None),
        ("00000000:47:00.0", 2),
        ("47:00.0", 2),
        ("0000:0F:00.0", 1),
        ("4", 4),  # a lost GPU is still found by its index...
    ],
)
def test_find_gpu(token, expected):
    found = find_gpu([*SAME, LOST], token)
    assert (found.index if found else None) == expected


@pytest.mark.parametrize(
    ("value", "have_driver", "gpus", "status", "devices"),
    [
        (None, False, [], "skip", []),
        ("0", False, [], "skip", []),  # no driver: nothing to match; a CPU run, not an error
        ("0,1", False, [], "skip", []),
        ("banana", False, [], "warn", []),
        ("-1", False, [], "skip", []),  # hides every GPU; there is none anyway
        ("-1", True, SAME, "warn", []),  # the common way to hide GPUs: said, and a CPU run
        ("", True, SAME, "warn", []),
        ("0,9", True, SAME, "fail", [0]),
        ("1,1", True, SAME, "fail", []),
        ("2,0", True, SAME, "ok", [2, 0]),
    ],
)
def test_one_verdict_for_doctor_and_launch(value, have_driver, gpus, status, devices):
    env = (
        {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        if value is None
        else {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": value}
    )
    verdict = judge_visible_devices(gpus, env, have_driver=have_driver)
    assert (verdict.status, [g.index for g in verdict.devices]) == (status, devices), verdict
    assert (verdict.fix is None) == (status in ("ok", "skip")), verdict
