#!/usr/bin/env python3
"""semflow top --json against real traffic: a child process sends and receives known byte
counts over loopback TCP; the snapshot lines must show exactly those bytes for its pid.
Needs root and BPF (CI has both); otherwise FAILs with the monitor's reason."""
import json, os, select, socket, subprocess, sys, time

BIN = os.environ.get("SEMFLOW_BIN", "build/semflow")
TX, RX = 3_000_001, 777_777


def fail(name, why):
    print(f"FAIL: {name}: {why}")


def traffic_child():
    """Fork a client/server pair in one child process; returns (pid, pipe to release it)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        cli = socket.create_connection(srv.getsockname())
        conn, _ = srv.accept()
        cli.sendall(b"x" * TX)
        got = 0
        while got < TX:
            got += len(conn.recv(65536))
        conn.sendall(b"y" * RX)
        got = 0
        while got < RX:
            got += len(cli.recv(65536))
        os.read(r, 1)  # stay alive until the parent has looked
        os._exit(0)
    os.close(r)
    return pid, w


def main():
    # bad usage: exit 2 with a message
    p = subprocess.run([BIN, "top", "--interval", "abc"], capture_output=True, text=True)
    if p.returncode == 2 and "--interval" in p.stderr:
        print("PASS: top_rejects_bad_interval")
    else:
        fail("top_rejects_bad_interval", f"rc {p.returncode} stderr {p.stderr!r}")

    for bad in ("2x", "0", ""):  # a count with a suffix is refused, not read as its digits
        p = subprocess.run([BIN, "top", "--gpus", bad], capture_output=True, text=True)
        if p.returncode == 2 and "--gpus" in p.stderr:
            print(f"PASS: top_rejects_bad_gpus {bad!r}")
        else:
            fail("top_rejects_bad_gpus", f"{bad!r}: rc {p.returncode} stderr {p.stderr!r}")

    p = subprocess.run([BIN, "top", "--json", "--once", "--no-discover"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        fail("top_json_once", f"rc {p.returncode}: {p.stderr.strip()}")
        return
    snap = json.loads(p.stdout.splitlines()[0])
    if isinstance(snap.get("processes"), list) and snap.get("gpus") and snap["gpus"][0]["link"] == "nominal":
        print("PASS: top_json_once")
    else:
        fail("top_json_once", p.stdout[:300])

    top = subprocess.Popen([BIN, "top", "--json", "--interval", "0.2", "--no-discover"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = top.stdout.readline()  # the monitor is attached once the first line is out
        if not first:
            fail("top_counts_socket_bytes", "no output: " + top.stderr.read().strip())
            return
        pid, release = traffic_child()
        deadline, seen = time.time() + 10, None
        while time.time() < deadline:
            ready, _, _ = select.select([top.stdout], [], [], 1.0)
            if not ready:
                continue
            line = top.stdout.readline()
            if not line:
                break
            for pr in json.loads(line)["processes"]:
                if pr["pid"] == pid:
                    seen = pr
            # client and server share the pid: each side counts once per direction
            if seen and seen["sock_tx_bytes"] == TX + RX and seen["sock_rx_bytes"] == TX + RX:
                break
        os.close(release)
        os.waitpid(pid, 0)
        if seen and seen["sock_tx_bytes"] == TX + RX and seen["sock_rx_bytes"] == TX + RX:
            print("PASS: top_counts_socket_bytes")
        else:
            fail("top_counts_socket_bytes", f"pid {pid} sent/received {TX + RX} each way; top saw {seen}")
    finally:
        top.terminate()
        try:
            top.wait(timeout=5)
        except subprocess.TimeoutExpired:
            top.kill()
    if top.returncode in (0, -15):
        print("PASS: top_exits_on_sigterm")
    else:
        fail("top_exits_on_sigterm", f"rc {top.returncode}")


if __name__ == "__main__":
    main()
