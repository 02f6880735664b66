"""Another user on the same machine (docs/security.md, round 2: rows 1, 4, 5), done for real: the
test creates a second local user (useradd), runs the real `xl` and real squatters as that user
(runuser), and removes the user again.

- row 1: the user holds node 0's collector port: node 0 fails loudly (one line, exit 1, nothing
  left running) instead of training without telemetry; a node link that meets the squatter sends
  it no token and no record.
- row 4: the user binds the abstract socket names `xl stacks` used to derive from the next pids:
  every rank still answers (the names are unpredictable now, and each side checks the other).
- row 5: the user's `xl stop`, `xl logs`, `xl stacks` and `xl attach` on a run they cannot read
  say "not yours (permission denied)" in one line, exit 1, and the run goes on; `xl runs` lists it
  as "not yours", not damaged. The owner's own `xl stop` still stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from procs import (
    XL,
    end_run,
    first_run,
    kill_run,
    rdzv_port,
    run_json,
    run_processes,
    wait_for,
    wait_no_processes,
    wait_ranks_running,
    wait_run,
    xl,
    xl_env,
)
from where import REPO

from xl.launcher.multinode import nodelink
from xl.launcher.multinode.protocol import LogMessage
from xl.launcher.rank.stacks import peer_is

PYTHON = shutil.which(
    f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin"
)
# This venv's packages; its editable finder maps xl to this checkout.
SITE = sysconfig.get_paths()["purelib"]
BOOT = (
    "import runpy, site, sys; site.addsitedir({site!r}); sys.argv[0] = 'xl'; "
    "runpy.run_module('xl', run_name='__main__', alter_sys=True)"
)
TOKEN = "security-token-" + "0123456789abcdef"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or PYTHON is None or shutil.which("useradd") is None,
    reason="needs root (to add a user) and a system Python of this version",
)

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    print("ready", flush=True)
    deadline = time.time() + 120  # never outlives the test
    while not os.path.exists(sys.argv[1]) and time.time() < deadline:
        time.sleep(0.05)
    """
)


@contextlib.contextmanager
def code_reachable() -> Iterator[None]:
    """Another user can reach this checkout and its venv, as they could an installed xl: a
    folder above them that others cannot enter (a clone under `mktemp -d`) gets o+x (enter,
    not list) for the test, and its own mode back after."""
    opened: list[tuple[Path, int]] = []
    try:
        for leaf in (Path(SITE), REPO):
            for folder in (leaf, *leaf.parents):
                mode = stat.S_IMODE(folder.stat().st_mode)
                if not mode & stat.S_IXOTH and all(f != folder for f, _ in opened):
                    folder.chmod(mode | stat.S_IXOTH)
                    opened.append((folder, mode))
        yield
    finally:
        for folder, mode in reversed(opened):
            folder.chmod(mode)


@pytest.fixture
def stranger() -> Iterator[str]:
    name = f"xlsec{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True, timeout=60)
    try:
        with code_reachable():
            yield name
    finally:
        for proc in psutil.process_iter(["username"]):
            if proc.info["username"] == name:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        subprocess.run(["userdel", name], check=True, timeout=60)


@pytest.fixture
def shared_home() -> Iterator[Path]:
    """An XL_HOME that other users may look into (as a home or a shared disk is): runs/ is
    0755, each run dir is as xl makes it (private)."""
    home = Path(tempfile.mkdtemp(prefix="xl-sec-", dir="/tmp"))
    try:
        home.chmod(0o755)
        (home / "runs").mkdir(mode=0o755)
        (home / "runs").chmod(0o755)
        yield home
    finally:
        for run_dir in (home / "runs").iterdir():
            kill_run(run_dir)
        shutil.rmtree(home, ignore_errors=True)


def as_user(
    user: str, args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The real `xl` as ``user`` (this venv's packages, the system's Python of the same version)."""
    assert PYTHON is not None
    clean = {k: v for k, v in env.items() if k in ("PATH", "XL_HOME", "LANG", "TERM")}
    return subprocess.run(
        ["runuser", "-u", user, "--", PYTHON, "-c", BOOT.format(site=SITE), *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def _launch(home: Path, tmp: Path, nproc: int) -> Path:
    script = home / "train.py"
    script.write_text(SCRIPT)
    done = xl(
        ["launch", "--detach", "--nproc", str(nproc), str(script), str(tmp / "go")],
        xl_env(home),
        cwd=home,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = wait_run(home)
    wait_ranks_running(run_dir, nproc, timeout=90)
    return run_dir


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_another_users_commands_on_a_run_say_not_yours_and_the_run_goes_on(
    stranger: str, shared_home: Path, tmp_path: Path
) -> None:
    run_dir = _launch(shared_home, tmp_path, 1)
    run_id = run_dir.name
    env = xl_env(shared_home)
    try:
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        for args in (
            ["stop", run_id],
            ["stop", "last"],
            ["logs", run_id],
            ["stacks", run_id],
            ["attach", run_id, "--no-tui"],
        ):
            proc = as_user(stranger, args, env)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            line = _one_line(proc)
            assert (
                f"run {run_id} is not yours (permission denied: its folder belongs to user root)"
                in line
            ), line
            assert "stopped" not in proc.stdout
        listed = as_user(stranger, ["runs"], env)
        assert listed.returncode == 0, listed.stderr
        [row] = [ln for ln in listed.stdout.splitlines() if ln.startswith(run_id)]
        assert (
            "not yours" in row
            and "damaged" not in listed.stdout
            and "unreadable" not in listed.stdout
        ), listed.stdout
        # The run went on through all of that.
        run = run_json(run_dir)
        assert run["status"] == "running" and all(p.is_running() for p in run_processes(run_dir))
        # Its owner stops it as before.
        stop = xl(["stop", run_id], env, timeout=120)
        assert stop.returncode == 0 and f"{run_id} stopped" in stop.stdout, (
            stop.stdout + stop.stderr
        )
        wait_no_processes(run_dir, timeout=30)
    finally:
        (tmp_path / "go").touch()
        kill_run(run_dir)


SQUAT_NAMES = textwrap.dedent(
    """
    import resource, socket, sys
    first, count = int(sys.argv[1]), int(sys.argv[2])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    held = []
    for pid in range(first, first + count):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind("\\0xl-stacks-%d" % pid)  # the name a rank with this pid used to answer on
            s.listen(1)
            held.append(s)
        except OSError:
            s.close()
    print(len(held), flush=True)
    sys.stdin.read()  # held until the test closes our stdin
    """
)


def test_xl_stacks_answers_when_another_user_squats_the_next_pids_names(
    stranger: str, shared_home: Path, tmp_path: Path
) -> None:
    assert PYTHON is not None
    first = int(Path("/proc/sys/kernel/ns_last_pid").read_text()) + 1
    squat = subprocess.Popen(
        ["runuser", "-u", stranger, "--", PYTHON, "-c", SQUAT_NAMES, str(first), "4000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    run_dir = None
    try:
        assert squat.stdout is not None and int(squat.stdout.readline()) > 3000
        run_dir = _launch(shared_home, tmp_path, 2)
        pids = [r["pid"] for r in run_json(run_dir)["ranks"]]
        assert all(first <= pid < first + 4000 for pid in pids), (
            first,
            pids,
        )  # each name was taken before it started
        stacks = xl(["stacks", run_dir.name, "--json"], xl_env(shared_home), timeout=60)
        assert stacks.returncode == 0, stacks.stderr
        doc = json.loads(stacks.stdout)
        assert sorted(e["rank"] for e in doc["ranks"]) == [0, 1]
        for entry in doc["ranks"]:
            assert "error" not in entry and entry["threads"], entry
            assert "xl-stacks" not in {
                t.get("name") for t in entry["threads"]
            }  # the door answers, its own thread hidden
        # The rank's name is its own: 128 random bits, not the pid alone.
        door = json.loads((run_dir / "ranks" / "rank-0.stacks.json").read_text())
        assert (
            door["socket"] != f"xl-stacks-{door['pid']}"
            and len(door["socket"]) >= len(f"xl-stacks-{door['pid']}-") + 32
        )
    finally:
        (tmp_path / "go").touch()
        if squat.stdin is not None:
            squat.stdin.close()
        squat.wait(timeout=30)
        end_run(None, run_dir, timeout=60)


def test_a_requester_reads_nothing_from_a_socket_another_process_bound(stranger: str) -> None:
    """A rank that died leaves its name in /proc/net/unix; whoever binds it next is not the rank."""
    assert PYTHON is not None
    name = f"xl-stacks-test-{secrets.token_hex(8)}"
    holder = subprocess.Popen(
        [
            "runuser",
            "-u",
            stranger,
            "--",
            PYTHON,
            "-c",
            "import socket, sys; s = socket.socket(socket.AF_UNIX); "
            "s.bind('\\0' + sys.argv[1]); s.listen(1); "
            "print('up', flush=True); sys.stdin.read()",
            name,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "up"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect("\0" + name)
            assert not peer_is(sock, os.getpid())  # the pid a rank's door file would name
            assert peer_is(sock, holder_pid(holder.pid))  # the one that bound it, for contrast
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


STRANGER_ASKS = (
    "import socket, sys; s = socket.socket(socket.AF_UNIX); s.settimeout(20); "
    "s.connect('\\0' + sys.argv[1]); "
    "got = b''\n"
    "while (part := s.recv(65536)): got += part\n"
    "print(len(got))"
)


def test_another_user_who_finds_a_rank_s_stacks_socket_is_told_nothing(
    stranger: str, shared_home: Path, tmp_path: Path
) -> None:
    """An abstract socket has no file mode and its name is listed in /proc/net/unix for every
    user: the rank itself must refuse a caller of another uid (SO_PEERCRED). The same request
    from the run's own user gets the rank's threads."""
    assert PYTHON is not None
    run_dir = _launch(shared_home, tmp_path, 1)
    try:
        door_file = run_dir / "ranks" / "rank-0.stacks.json"
        wait_for(door_file.exists, timeout=60, what="rank 0's stacks door")
        door = json.loads(door_file.read_text())
        listed = Path("/proc/net/unix").read_text()
        assert "@" + door["socket"] in listed  # anyone can find the name
        asked = subprocess.run(
            ["runuser", "-u", stranger, "--", PYTHON, "-c", STRANGER_ASKS, door["socket"]],
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
        assert asked.returncode == 0, asked.stderr  # connected, then closed on
        assert asked.stdout.strip() == "0", asked.stdout[:500]
        mine = subprocess.run(
            [sys.executable, "-c", STRANGER_ASKS, door["socket"]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert mine.returncode == 0 and int(mine.stdout) > 100, mine.stdout + mine.stderr
        assert run_json(run_dir)["status"] == "running"  # the rank goes on
    finally:
        (tmp_path / "go").touch()
        end_run(None, run_dir, timeout=60)


def holder_pid(runuser_pid: int) -> int:
    """The Python that runuser started (its child)."""
    kids = psutil.Process(runuser_pid).children()
    return kids[0].pid if kids else runuser_pid


SQUAT_PORT = textwrap.dedent(
    """
    import os, socket, sys, time
    port, wait = int(sys.argv[1]), float(sys.argv[2])
    print("waiting", flush=True)
    sys.stdin.readline()  # the test's word: node 0's supervisor is starting
    end = time.time() + 10
    while True:  # take the port the moment it is free
        try:
            srv = socket.create_server(("127.0.0.1", port))
            break
        except OSError:
            if time.time() > end:
                sys.exit("never got the port")
            time.sleep(0.0005)
    print("listening", flush=True)
    srv.settimeout(0.5)
    got = b""
    end = time.time() + wait
    while time.time() < end:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        conn.settimeout(3.0)
        conn.sendall(b"XLH1" + os.urandom(16))  # looks like a collector's challenge
        try:
            while data := conn.recv(65536):
                got += data
                conn.sendall(os.urandom(32))  # and answers anything, proving nothing
        except OSError:
            pass
        conn.close()
    sys.stdout.write(got.hex() + "\\n")
    """
)


def test_node_0_fails_loudly_when_another_user_takes_its_collector_port(
    stranger: str, shared_home: Path, tmp_path: Path
) -> None:
    """`xl launch` checks the port; another user takes it between that check and the supervisor's
    bind. Node 0 must not train on without its collector (every node sends there): the run fails
    at once, naming the port and the fix."""
    assert PYTHON is not None
    rdzv = rdzv_port()
    squat = subprocess.Popen(
        ["runuser", "-u", stranger, "--", PYTHON, "-c", SQUAT_PORT, str(rdzv + 1), "8"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    node0 = None
    try:
        assert squat.stdout is not None and squat.stdin is not None
        assert squat.stdout.readline().strip() == "waiting"
        script = shared_home / "train.py"
        script.write_text(SCRIPT)
        env = xl_env(shared_home, XL_TOKEN=TOKEN)
        node0 = subprocess.Popen(
            [
                *XL,
                "launch",
                "--no-tui",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--rdzv",
                f"127.0.0.1:{rdzv}",
                "--nproc",
                "1",
                str(script),
                str(tmp_path / "go"),
            ],
            env=env,
            cwd=shared_home,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        run_dir = wait_for(
            lambda: first_run(shared_home), timeout=60, what="the run dir", interval=0.002
        )
        squat.stdin.write("go\n")
        squat.stdin.flush()
        assert squat.stdout.readline().strip() == "listening"
        out = node0.communicate(timeout=120)[0]
        assert node0.returncode == 1, out
        assert (
            f"node 0's collector cannot listen on 127.0.0.1:{rdzv + 1}" in out
            and "XL_COLLECTOR_PORT" in out
        ), out
        assert "Traceback" not in out
        run = run_json(run_dir)
        # xl launch returns once run.json says the run ended: the record is there to read.
        evidence = (
            sorted(p.name for p in run_dir.iterdir()),
            (run_dir / "supervisor.log").read_text(errors="replace")[-2000:],
        )
        assert run.get("status") == "failed" and "cannot listen" in (run.get("failure") or {}).get(
            "message", ""
        ), (run, evidence)
        assert not (run_dir / "logs" / "rank-0.log").exists()  # no rank ever started
        wait_no_processes(run_dir, timeout=30)
        # Node 1's link meets the squatter: it sends no token and no record, and says why.
        link = nodelink.NodeLink("127.0.0.1", rdzv + 1, TOKEN, 1, "node-b")
        link.start()
        link.send(LogMessage(1, "secret training output\n"))
        time.sleep(2.0)
        assert not link.close(0.5)  # nothing was acknowledged
        assert link.refused is None  # a squatter is not node 0 refusing the token
        got = bytes.fromhex(squat.communicate(timeout=30)[0].strip() or "")
        assert got, "the link never reached the squatter"
        assert TOKEN.encode() not in got and b"secret" not in got and len(got) % 53 == 0, got[:200]
    finally:
        for proc in (squat, node0):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
