#!/usr/bin/env bash
# The GPU acceptance run on a lent GPU machine that has torch with CUDA but not xl's other
# dependencies: one command, every step under its own timeout, logs and figures under $OUT.
#
#   OUT=/tmp/acc bench/gpu_run.sh                      # the suite, then the overhead bench
#   TESTS="tests/gpu/test_gpu_launch.py" BENCH_S=0 DIAG=0 bench/gpu_run.sh   # one file only
#
# Wheels in .whl/ (xl's dependencies the machine lacks, see bench/README.md 'GPU acceptance')
# are installed under /tmp/site; xl itself is installed editable, so `python -m xl` run from
# the repo root (the suite does) finds doctor/, launcher/, tui/ mapped under `xl`.
# Writes: install.log env.txt diag.json pytest.log junit.xml bench.log overhead.json, and the
# step hooks' own bench (bench/gpu_steps_bench.py): steps_bench.log steps_overhead.json.
set -u -o pipefail
OUT=${OUT:-$(mktemp -d)}
PY=${PY:-python3}
TESTS=${TESTS:-tests/gpu}
SUITE_S=${SUITE_S:-270}
BENCH_S=${BENCH_S:-170}
PAIRS=${PAIRS:-4}
STEPS=${STEPS:-400}
AB_STEPS=${AB_STEPS:-400}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }

step "install"
if compgen -G ".whl/*.whl" >/dev/null; then
    timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl >"$OUT/install.log" 2>&1 \
        || { cat "$OUT/install.log"; exit 3; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! timeout 180 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    >>"$OUT/install.log" 2>&1; then
    echo "editable install failed (install.log); the wheel instead"
    tail -5 "$OUT/install.log"
    timeout 120 "$PY" -m pip install -q --no-index --no-deps .whl/xl/*.whl >>"$OUT/install.log" 2>&1 \
        || { cat "$OUT/install.log"; exit 3; }
fi
(cd /tmp && timeout 60 "$PY" -c "import xl, xl.doctor, xl.launcher, xl.tui, textual, orjson; print('xl', xl.__file__)") \
    || exit 3

step "machine"
{
    nvidia-smi
    nvidia-smi -q | head -80
    uname -a
    nproc
    "$PY" -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), torch.cuda.get_device_name(0))"
    "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|nvidia-ml-py|pytest|pytest-timeout|psutil|rich|setuptools|ninja|packaging|numpy|textual|orjson) "
    command -v nvcc && nvcc --version
    command -v xl
    echo "CUDA_HOME=${CUDA_HOME:-} PATH=$PATH"
} >"$OUT/env.txt" 2>&1
head -30 "$OUT/env.txt"

if [ "${DIAG:-1}" != 0 ]; then
step "diag (raw NVML, torch, xl gpus, xl doctor)"
timeout 180 "$PY" - "$OUT/diag.json" <<'EOF' || echo "diag failed ($?)"
import json, subprocess, sys
out = {}
def cmd(*argv):
    p = subprocess.run([sys.executable, "-m", "xl", *argv], capture_output=True, text=True, timeout=150)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"rc": p.returncode, "stdout": p.stdout[-2000:], "stderr": p.stderr[-2000:]}
out["xl_gpus"] = cmd("gpus", "--json")
out["xl_doctor"] = cmd("doctor", "--json")
import pynvml as nv
try:
    nv.nvmlInit()
    n = nv.nvmlDeviceGetCount()
except Exception as e:
    out["nvml_error"], n = repr(e), 0
def safe(f, *a):
    try:
        v = f(*a)
    except Exception as e:
        return f"ERR {type(e).__name__}: {e}"
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if hasattr(v, "_fields_"):
        return {k: safe(lambda: getattr(v, k)) for k, _ in v._fields_}
    if isinstance(v, (list, tuple)):
        return [safe(lambda x=x: x) for x in v]
    return v if isinstance(v, (int, float, str, type(None), dict)) else repr(v)
sysinfo = {k: safe(getattr(nv, k)) for k in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
           "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")}
out["nvml_system"] = sysinfo
devs = []
for i in range(n):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    d = {}
    for name, args in [("nvmlDeviceGetName", ()), ("nvmlDeviceGetUUID", ()), ("nvmlDeviceGetSerial", ()),
                       ("nvmlDeviceGetPciInfo", ()), ("nvmlDeviceGetPciInfo_v3", ()), ("nvmlDeviceGetMemoryInfo", ()),
                       ("nvmlDeviceGetMemoryInfo", (0x02000028,)), ("nvmlDeviceGetUtilizationRates", ()),
                       ("nvmlDeviceGetTemperature", (0,)), ("nvmlDeviceGetTemperatureV", (0,)), ("nvmlDeviceGetPowerUsage", ()),
                       ("nvmlDeviceGetEnforcedPowerLimit", ()), ("nvmlDeviceGetPowerManagementLimit", ()),
                       ("nvmlDeviceGetPowerManagementDefaultLimit", ()), ("nvmlDeviceGetMigMode", ()),
                       ("nvmlDeviceGetCudaComputeCapability", ()), ("nvmlDeviceGetPersistenceMode", ()),
                       ("nvmlDeviceGetComputeMode", ()), ("nvmlDeviceGetEccMode", ()), ("nvmlDeviceGetTotalEccErrors", (1, 1)),
                       ("nvmlDeviceGetRetiredPages", (1,)), ("nvmlDeviceGetRetiredPagesPendingStatus", ()),
                       ("nvmlDeviceGetRemappedRows", ()), ("nvmlDeviceGetClockInfo", (1,)), ("nvmlDeviceGetMaxClockInfo", (1,)),
                       ("nvmlDeviceGetPerformanceState", ()), ("nvmlDeviceGetBAR1MemoryInfo", ()), ("nvmlDeviceGetDisplayMode", ()),
                       ("nvmlDeviceGetDisplayActive", ()), ("nvmlDeviceGetFanSpeed", ()), ("nvmlDeviceGetMinorNumber", ()),
                       ("nvmlDeviceGetIndex", ()), ("nvmlDeviceGetEncoderUtilization", ()), ("nvmlDeviceGetDecoderUtilization", ()),
                       ("nvmlDeviceGetComputeRunningProcesses", ()), ("nvmlDeviceGetGraphicsRunningProcesses", ())]:
        d[name + (str(list(args)) if args else "")] = safe(getattr(nv, name), h, *args)
    devs.append(d)
out["nvml_devices"] = devs
code = ("import json, torch\nc = torch.cuda\nr = []\nfor i in range(c.device_count()):\n"
        "    p = c.get_device_properties(i)\n"
        "    r.append({'name': p.name, 'uuid_str': str(p.uuid), 'uuid_type': type(p.uuid).__name__,"
        " 'cc': [p.major, p.minor], 'total': p.total_memory, 'sms': p.multi_processor_count,"
        " 'pci': [getattr(p, k, None) for k in ('pci_bus_id', 'pci_device_id', 'pci_domain_id')],"
        " 'clock_khz': getattr(p, 'clock_rate', None)})\n"
        "print(json.dumps({'devices': r, 'arch_list': c.get_arch_list(), 'nccl': list(c.nccl.version())}))")
p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
out["torch"] = json.loads(p.stdout) if p.returncode == 0 else p.stderr[-2000:]
json.dump(out, open(sys.argv[1], "w"), indent=1, default=repr)
print(json.dumps({"gpus": out["xl_gpus"].get("gpus", out["xl_gpus"]), "torch": out["torch"]})[:1500])
print("doctor:", [(c["id"], c["status"]) for c in out["xl_doctor"].get("checks", [])])
EOF
fi

step "suite: pytest -m gpu $TESTS (timeout ${SUITE_S} s)"
timeout -k 10 "$SUITE_S" "$PY" -m pytest -q -p no:randomly -m gpu -rfEs --durations=0 \
    --junitxml="$OUT/junit.xml" $TESTS 2>&1 | tee "$OUT/pytest.log"
echo "suite rc=$?"

if [ "$BENCH_S" -gt 0 ]; then
    step "bench: bench_overhead.py --gpu --pairs $PAIRS --steps $STEPS (timeout ${BENCH_S} s)"
    timeout -k 10 "$BENCH_S" "$PY" bench/bench_overhead.py --gpu --pairs "$PAIRS" \
        --steps "$STEPS" --skip 100 --ab-steps "$AB_STEPS" --json "$OUT/overhead.json" 2>&1 \
        | tee "$OUT/bench.log"
    echo "bench rc=$?"
fi
if [ "${STEPS_BENCH_S:-240}" -gt 0 ]; then
    step "bench: gpu_steps_bench.py --pairs ${STEPS_PAIRS:-4} (the step hooks on CUDA events vs --no-instrument, timeout ${STEPS_BENCH_S:-240} s)"
    timeout -k 10 "${STEPS_BENCH_S:-240}" "$PY" bench/gpu_steps_bench.py --pairs "${STEPS_PAIRS:-4}" \
        --steps "$STEPS" --json "$OUT/steps_overhead.json" 2>&1 | tee "$OUT/steps_bench.log"
    echo "steps bench rc=$?"
fi
step "done"
