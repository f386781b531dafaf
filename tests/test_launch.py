"""The multi-process launcher (`python -m replug_jax.launch`): real JAX processes on 127.0.0.1, CPU
collectives through gloo, output forwarded with a process prefix, failures propagated."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from replug_jax import launch
from replug_jax.parallel.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "multiprocess_child.py")


def launch_children(processes, devices, *child_args, timeout=240):
    command = [sys.executable, "-m", "replug_jax.launch", "--processes", str(processes), "--devices", str(devices),
               "--", sys.executable, CHILD, *child_args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("processes,devices", [(2, 2), (4, 1)])
def test_processes_join_and_reduce_across_each_other(processes, devices):
    done = launch_children(processes, devices)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reports = re.findall(r"^\[process (\d)\] id=(\d) processes=(\d) devices=(\d+) local=(\d+) sum=(\S+)$",
                         done.stdout, re.M)
    assert sorted(int(r[0]) for r in reports) == list(range(processes))
    expected_sum = devices * sum(i + 1 for i in range(processes))  # every device of every process contributed
    for prefix, index, count, total_devices, local, total in reports:
        assert prefix == index and int(count) == processes and int(local) == devices
        assert int(total_devices) == processes * devices and float(total) == expected_sum


def test_a_failing_process_fails_the_launch_and_stops_the_others():
    done = launch_children(2, 1, "1")
    assert done.returncode == 3, done.stdout[-3000:]
    assert "[process 1] process 1 fails on purpose" in done.stdout
    assert "[launch] process 1 failed with exit code 3" in done.stdout
    assert "sum=" not in done.stdout  # process 0 was stopped while it waited for process 1


def test_child_environment_and_bad_usage():
    env = launch.child_env(1, 4, 5555, 3, base={"XLA_FLAGS": "--xla_foo=1 --xla_force_host_platform_device_count=8"})
    assert env[ENV_COORDINATOR] == "127.0.0.1:5555" and env[ENV_NUM_PROCESSES] == "4" and env[ENV_PROCESS_ID] == "1"
    assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=3"
    with pytest.raises(ValueError, match="at least 1"):
        launch.run(["true"], 0)
    with pytest.raises(ValueError, match="no command"):
        launch.run([], 2)
    with pytest.raises(SystemExit, match="usage"):
        launch.main(["--processes", "2", "python"])
    for asked in (["--help"], ["-h"]):  # asked for, the usage is an answer: exit 0 (it was exit 1)
        done = subprocess.run([sys.executable, "-m", "replug_jax.launch", *asked], capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.startswith("usage: python -m replug_jax.launch"), done


@pytest.mark.parametrize("victim", [0, 1], ids=["coordinator-killed", "worker-killed"])
def test_a_killed_process_stops_its_peer_without_a_common_launcher(victim):
    """Two processes started apart (two hosts: no launcher to stop the survivor); one is SIGKILLed while the other
    waits at a barrier. The coordination service's heartbeat (REPLUG_JAX_HEARTBEAT_S=5) aborts the survivor
    within seconds instead of the barrier's 24 h."""
    import time

    port = launch.free_port()
    child = os.path.join(ROOT, "tests", "heartbeat_child.py")
    started = time.time()
    procs = [subprocess.Popen([sys.executable, child, str(victim)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**launch.child_env(i, 2, port, 1), "REPLUG_JAX_HEARTBEAT_S": "5"})
             for i in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    survivor = procs[1 - victim]
    assert time.time() - started < 90
    assert "joined" in outputs[1 - victim] and "passed a barrier" not in outputs[1 - victim]
    assert survivor.returncode != 0 and procs[victim].returncode == -9


def _raw(port: int, line: bytes) -> dict:
    """One raw request line to the store on loopback, its reply (the store closes refused connections)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(line)
        reply = sock.makefile("rb").readline()
    return json.loads(reply)


def test_host_store_gathers_waits_frees_and_times_out():
    """The host store behind barriers and gathers: a gather waits for a later set from another thread and returns
    every process's exact text; the keys are freed once every reader has them; a missing key times out with its
    name, and the client's next call still works (no stale reply)."""
    import threading
    import time

    from replug_jax.parallel.host_store import HostStore, HostStoreClient

    store = HostStore("127.0.0.1", secret="s3cret", readers=2)
    try:
        one, two = HostStoreClient("127.0.0.1", store.port, "s3cret"), HostStoreClient("127.0.0.1", store.port, "s3cret")
        one.set("k/0", "zero")
        later = threading.Thread(target=lambda: (time.sleep(0.3), two.set("k/1", '{"é": [1, 2]}')))
        later.start()
        assert one.gather("k", 2, 10) == ["zero", '{"é": [1, 2]}']
        later.join()
        assert store.key_count() == 2  # the second reader has not gathered yet
        assert two.gather("k", 2, 10) == ["zero", '{"é": [1, 2]}']
        assert store.key_count() == 0  # freed: a barrier leaves nothing behind
        with pytest.raises(TimeoutError, match="'absent/0'"):
            one.gather("absent", 1, 0.2)
        one.set("after/0", "x")  # a new connection after the failed call
        assert one.gather("after", 1, 5) == ["x"]
    finally:
        store.close()


@pytest.mark.parametrize("request_line, refusal", [
    (b'{"op": "set", "key": "replug_jax/gather/MainThread/0/1", "value": "forged"}\n', "wrong or missing secret"),
    (b'{"op": "set", "key": "k/0", "value": "v", "secret": "guess"}\n', "wrong or missing secret"),
    (b'{"op": "gather", "key": "k", "count": 1, "timeout_s": null, "secret": "s3cret"}\n', "timeout_s must be"),
    (b'{"op": "gather", "key": "k", "count": 1, "timeout_s": 1e9, "secret": "s3cret"}\n', "timeout_s must be"),
    (b'{"op": "gather", "key": "k", "count": "2", "timeout_s": 1, "secret": "s3cret"}\n', "count must be"),
    (b'{"op": "set", "key": "k/0", "value": 5, "secret": "s3cret"}\n', "value must be a string"),
    (b'["set"]\n', "JSON object"),
    (b'not json\n', "one line of JSON"),
    (b'{"op": "set", "key": "k/0", "value": "' + b"x" * (1 << 20) + b'", "secret": "s3cret"}\n', "longer than"),
])
def test_host_store_refuses_bad_requests(request_line, refusal):
    """No secret, a wrong one, a null or huge timeout, bad types or an over-long line: refused, nothing stored,
    and the store goes on serving its own clients."""
    from replug_jax.parallel.host_store import HostStore, HostStoreClient

    store = HostStore("127.0.0.1", secret="s3cret")
    try:
        started = time.time()
        reply = _raw(store.port, request_line)
        assert refusal in reply["error"] and reply["error"].startswith("refused") and time.time() - started < 5
        assert store.key_count() == 0
        client = HostStoreClient("127.0.0.1", store.port, "s3cret")
        client.set("k/0", "v")
        assert client.gather("k", 1, 5) == ["v"]
    finally:
        store.close()


def test_host_store_address_is_one_peers_reach(monkeypatch):
    """Under multihost the store is served on an address that is not loopback: a host name mapped to 127.0.1.1
    (Debian, SLURM) is refused with the variable that fixes it; an IPv6 address survives the broadcast record."""
    import socket

    from replug_jax.parallel import distributed

    monkeypatch.delenv(distributed.ENV_STORE_HOST, raising=False)
    fake = {"127.0.1.1": [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.1.1", 0))],
            "both": [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::7", 0, 0, 0)),
                     (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", 0))],
            "v6": [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::7", 0, 0, 0))]}
    for name, expected in (("127.0.1.1", None), ("both", "10.1.2.3"), ("v6", "fd00::7")):
        monkeypatch.setattr(socket, "gethostname", lambda: name)
        monkeypatch.setattr(socket, "getfqdn", lambda: name)
        monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: fake[host])
        if expected is None:
            with pytest.raises(RuntimeError, match=distributed.ENV_STORE_HOST):
                distributed.reachable_address()
        else:
            assert distributed.reachable_address() == expected
    monkeypatch.setenv(distributed.ENV_STORE_HOST, "192.0.2.5")
    assert distributed.reachable_address() == "192.0.2.5"
    record = {"host": "fd00::7", "port": 51234, "secret": "ab" * 16}
    assert distributed.decode_address(distributed.encode_address(record)) == record


def test_a_raising_host_stops_its_peer_without_a_launcher(tmp_path):
    """Two hosts joined by `multihost=True` (JAX finds them in a SLURM-like environment; no launcher): process 1
    raises while process 0 waits at a barrier. fail_fast exits process 1 at once and the coordination service's
    heartbeat stops process 0: the job ends within seconds, the error named, not after a 24 h barrier."""
    child = os.path.join(ROOT, "tests", "failure_child.py")
    port = launch.free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REPLUG_JAX_", "SLURM_"))}
    env.update(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2", SLURM_STEP_NUM_NODES="1",
               JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", REPLUG_JAX_HEARTBEAT_S="5",
               REPLUG_JAX_HOST_STORE_HOST="127.0.0.1", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    started = time.time()
    procs = [subprocess.Popen([sys.executable, child, "raise"], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env={**env, "SLURM_PROCID": str(i),
                                                                        "SLURM_LOCALID": str(i)})
             for i in range(2)]
    outputs = [p.communicate(timeout=150)[0] for p in procs]
    assert time.time() - started < 90, outputs
    assert "process 1 joined" in outputs[1] and "ValueError: process 1 fails on purpose" in outputs[1]
    assert procs[1].returncode == 1 and procs[0].returncode != 0
    assert "passed a barrier" not in outputs[0]


def test_a_rebuild_failing_in_one_process_stops_both(tmp_path):
    """Building an index over 2 processes where process 1's share fails: both stop with the error named (the
    outcome is agreed), instead of process 0 waiting 24 h at the "embedded" barrier."""
    child = os.path.join(ROOT, "tests", "failure_child.py")
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "replug_jax.launch", "--processes", "2", "--devices", "1",
                           "--", sys.executable, child, "rebuild", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=150)
    assert time.time() - started < 90
    for index in (0, 1):
        assert (f"process {index} stopped: embedding {tmp_path}/index.embeddings.npy failed on process 1: "
                "OSError: disk full while embedding (on purpose)") in done.stdout, done.stdout[-3000:]
    assert "built an index" not in done.stdout and done.returncode == 0
