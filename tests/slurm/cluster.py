"""A private single-node SLURM (munged + slurmctld + slurmd) on this machine, for tests/test_slurm.py.

Everything lives in one temporary directory: a fresh munge key and socket, slurm.conf (from ``slurm.conf.in``),
state, spool, logs and pid files. Daemons run in the foreground as children of the test process, so they are
stopped by their own pids (never by name) in :meth:`LocalSlurm.stop`, which also cancels leftover jobs; should
the test process die without it, the daemons get SIGTERM from the kernel (PR_SET_PDEATHSIG).
SLURM client commands (``sbatch``, ``squeue``, ...) find this cluster through ``SLURM_CONF`` in :attr:`env`.

One wrinkle: inside a job, snakemake-executor-plugin-slurm-jobstep 0.6.1 runs the rule through a nested
``srun`` with every ``SLURM_*`` variable except the job's identity removed, SLURM_CONF included, so that
``srun`` would look for /etc/slurm/slurm.conf (or DNS SRV records) and fail. :attr:`env` therefore puts a
``bin/srun`` wrapper first on PATH (jobs inherit PATH through ``sbatch --export=ALL``) that restores
SLURM_CONF. Clusters with their config at the default path, or configless, do not need this.

Requirements: root (``SlurmUser=root``) and the Debian packages ``slurm-wlm`` and ``munge``; otherwise
:meth:`start` raises :class:`SlurmUnavailable` with the reason (the test skips with it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from string import Template

from tests.cpus import whole_machine

HERE = Path(__file__).resolve().parent
DAEMONS = ("munged", "munge", "unmunge", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun")
INSTALL_HINT = "apt-get install slurm-wlm munge"


class SlurmUnavailable(RuntimeError):
    """SLURM cannot be started here; the message says why."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the daemon, before exec: the whole machine's CPUs, own session (no terminal signals), SIGTERM when the
    test process dies."""
    whole_machine()
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _which(name: str) -> str | None:
    # The daemons live in /usr/sbin, which is not on every PATH.
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def missing_binaries() -> list[str]:
    return [name for name in DAEMONS + CLIENTS if _which(name) is None]


def node_hardware() -> dict[str, str]:
    """This host as slurmd sees it (``slurmd -C``), falling back to os.cpu_count() and /proc/meminfo."""
    hw: dict[str, str] = {}
    try:
        out = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True, timeout=30,
                             preexec_fn=whole_machine).stdout
        hw = dict(re.findall(r"(\w+)=(\S+)", out.splitlines()[0])) if out.strip() else {}
    except (OSError, subprocess.SubprocessError):
        pass
    cpus = int(hw.get("CPUs", os.cpu_count() or 1))
    if "RealMemory" in hw:
        mem = int(hw["RealMemory"])
    else:
        kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = kb // 1024
    return {
        "host": hw.get("NodeName") or socket.gethostname().split(".")[0],
        "cpus": str(cpus),
        "boards": hw.get("Boards", "1"),
        "sockets": hw.get("SocketsPerBoard", "1"),
        "cores": hw.get("CoresPerSocket", str(cpus)),
        "threads": hw.get("ThreadsPerCore", "1"),
        # A bit below the real memory: slurmd drains a node whose configured memory exceeds what it finds.
        "mem_mb": str(max(256, int(mem * 0.9))),
    }


class LocalSlurm:
    """Start with :meth:`start` (or ``with LocalSlurm() as cluster:``), always :meth:`stop`."""

    def __init__(self, root: str | Path | None = None, partition: str = "debug"):
        # A short path of our own: the munge socket path must stay below the 108-byte limit of AF_UNIX.
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="npm-slurm-"))
        self.partition = partition
        self.conf = self.root / "slurm.conf"
        self.log_dir = self.root / "log"
        self.procs: dict[str, subprocess.Popen] = {}
        self.hardware: dict[str, str] = {}

    # -- environment -------------------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        """The current environment with SLURM_CONF pointing at this cluster (and no inherited job variables)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_"))}
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = os.pathsep.join([str(self.root / "bin"), env.get("PATH", os.defpath)])
        return env

    def run(self, *args: str, check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    # -- start -------------------------------------------------------------------------------------------------
    def start(self, timeout: float = 90) -> LocalSlurm:
        missing = missing_binaries()
        if missing:
            raise SlurmUnavailable(f"SLURM/munge binaries not found: {', '.join(missing)} ({INSTALL_HINT})")
        if os.geteuid() != 0:
            raise SlurmUnavailable("a private slurmctld/slurmd with SlurmUser=root needs root")
        try:
            self._write_files()
            self._start_munged()
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait(lambda: self.run("scontrol", "ping").returncode == 0, 30, "slurmctld to answer `scontrol ping`")
            self._spawn("slurmd", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.hardware["host"]])
            self._wait(self._node_idle, timeout, f"node {self.hardware['host']} to be idle in sinfo")
        except SlurmUnavailable:
            self.stop()
            raise
        except Exception as exc:  # any start failure becomes a skip reason, with the logs
            self.stop()
            raise SlurmUnavailable(f"{exc}\n{self.log_tail()}") from exc
        return self

    def _write_files(self) -> None:
        for sub in ("state", "spool", "run", "log", "munge", "bin"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        srun = self.root / "bin" / "srun"  # see the module docstring
        srun.write_text(f'#!/bin/sh\nSLURM_CONF="{self.conf}" exec "{_which("srun")}" "$@"\n')
        srun.chmod(0o755)
        os.chmod(self.root / "munge", 0o755)  # munged wants the socket directory searchable by all
        self.hardware = node_hardware()
        self.munge_socket = self.root / "munge" / "munge.socket"
        values = dict(
            self.hardware,
            munge_socket=self.munge_socket,
            ctld_port=_free_port(),
            slurmd_port=_free_port(),
            state_dir=self.root / "state",
            spool_dir=self.root / "spool",
            run_dir=self.root / "run",
            log_dir=self.log_dir,
            partition=self.partition,
        )
        self.conf.write_text(Template((HERE / "slurm.conf.in").read_text()).substitute(values))
        (self.root / "run" / "plugstack.conf").write_text("")
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)

    def _start_munged(self) -> None:
        d = self.root / "munge"
        self._spawn("munged", [
            _which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
            f"--key-file={d / 'munge.key'}", f"--log-file={self.log_dir / 'munged.log'}",
            f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}",
        ])

        def munge_round_trip() -> bool:
            cred = subprocess.run([_which("munge"), "-n", "-S", str(self.munge_socket)], capture_output=True)
            if cred.returncode != 0:
                return False
            back = subprocess.run([_which("unmunge"), "-S", str(self.munge_socket)], input=cred.stdout,
                                  capture_output=True)
            return back.returncode == 0

        self._wait(munge_round_trip, 20, "munged to encode and decode a credential")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.log_dir / f"{name}.stdout", "wb")  # closed in stop()
        self.procs[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, preexec_fn=_die_with_parent)
        self.procs[name]._log = out  # type: ignore[attr-defined]

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmUnavailable(f"{name} exited with status {proc.returncode} while waiting for {what}\n"
                                           f"{self.log_tail()}")
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise SlurmUnavailable(f"timed out after {timeout:.0f}s waiting for {what}\n{self.log_tail()}")

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "--noheader", "--Node", "--format=%T", "--nodes", self.hardware["host"])
        return out.returncode == 0 and out.stdout.strip().rstrip("*") == "idle"

    # -- inspection --------------------------------------------------------------------------------------------
    def jobs(self) -> list[dict[str, str]]:
        """Every job slurmctld still knows (finished ones stay for MinJobAge): id, name, state, comment."""
        out = self.run("squeue", "--states=all", "--noheader", "--format=%i|%j|%T|%k")
        rows = [line.split("|", 3) for line in out.stdout.splitlines() if line.strip()]
        return [dict(zip(("id", "name", "state", "comment"), row, strict=False)) for row in rows]

    def log_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted(self.log_dir.glob("*")) if self.log_dir.is_dir() else []:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    # -- stop --------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel leftover jobs, then stop slurmd, slurmctld and munged by pid (TERM, then KILL)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                self.run("scancel", f"--partition={self.partition}", timeout=15)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and any(
                        j["state"] in ("RUNNING", "COMPLETING", "PENDING") for j in self.jobs()):
                    time.sleep(0.5)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
            proc._log.close()  # type: ignore[attr-defined]

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
