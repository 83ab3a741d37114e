"""Shared pieces of the Python integration tests: PASS/FAIL lines (the format tests/run.sh
counts), free loopback ports, and a `semflow serve` process that is healthy before it returns."""
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

BIN = os.environ.get("SEMFLOW_BIN", "build/semflow")
DATA = os.environ.get("SF_TESTDATA") or os.path.realpath("../shared/testdata")


class _Results:
    passed = 0
    failures = 0


results = _Results()


def check(name, cond, detail=""):
    if cond:
        results.passed += 1
        print("PASS: %s" % name)
    else:
        results.failures += 1
        print("FAIL: %s: %s" % (name, detail))
    sys.stdout.flush()


def run(*args, timeout=120):
    """Runs the semflow binary with args: (exit status, stdout, stderr) as text."""
    p = subprocess.run([BIN, *args], capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def sigterm_blocked(pid, tid=None):
    """Whether thread tid of process pid (its main thread if None) blocks SIGTERM; None if the
    thread is gone."""
    path = "/proc/%d/status" % pid if tid is None else "/proc/%d/task/%d/status" % (pid, tid)
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("SigBlk:"):
                    return int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1 == 1
    except OSError:
        return None
    return None


def rank_pids(parent):
    """Follower processes (`semflow rank`) whose parent is `parent` (by their ppid: the thread
    that forked them may have exited since)."""
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % p, "rb") as f:
                argv = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and len(argv) > 1 and argv[1] == b"rank":
            out.append(int(p))
    return out


def wait_or_kill(proc, timeout):
    """proc's exit status within timeout seconds, else SIGKILL and -9."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return -9


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class ServerProcess:
    """`semflow serve ARGS --host 127.0.0.1 --port <free>`, waited on until /health answers 200
    (saw_503 records whether it answered 503 while loading). Its log goes to a temp file that
    _cleanup() reads one last time and removes."""

    def __init__(self, args, env=None, prefix="semflow-serve-", preexec_fn=None, port=None):
        self.port = port or free_port()
        self.final_log = None
        self.saw_503 = False
        self.log = tempfile.NamedTemporaryFile(prefix=prefix, suffix=".log", delete=False)
        cmd = [BIN, "serve"] + list(args) + ["--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, env=env, preexec_fn=preexec_fn)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited with %d: %s" % (self.proc.returncode, self.logtext()))
            try:
                st = self._health()
                if st == 200:
                    return
                self.saw_503 |= st == 503
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become healthy: " + self.logtext())

    def _health(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            return r.status
        finally:
            c.close()

    def logtext(self):
        if self.final_log is not None:
            return self.final_log
        with open(self.log.name, errors="replace") as f:
            return f.read()[-3000:]

    def stop(self, timeout=60):
        """SIGTERM, then SIGKILL after timeout seconds; the log is read one last time. Returns the
        exit status (-9 when it had to be killed)."""
        self.proc.send_signal(signal.SIGTERM)
        rc = wait_or_kill(self.proc, timeout)
        self._cleanup()
        return rc

    def _cleanup(self):
        if self.final_log is None:
            self.final_log = self.logtext()
            os.unlink(self.log.name)
