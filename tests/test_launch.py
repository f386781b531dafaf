"""The multi-process launcher (`python -m replug_jax.launch`): real JAX processes on 127.0.0.1, CPU
collectives through gloo, output forwarded with a process prefix, failures propagated."""
import os
import re
import subprocess
import sys

import pytest

from replug_jax import launch
from replug_jax.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID

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


def test_host_store_sets_waits_and_times_out():
    """The host store behind barriers and gathers: a get waits for a later set from another thread, a missing key
    times out with its name, and values are exact text."""
    import threading
    import time

    from replug_jax.host_store import HostStore, HostStoreClient

    store = HostStore("127.0.0.1")
    try:
        client = HostStoreClient("127.0.0.1", store.port)
        later = threading.Thread(target=lambda: (time.sleep(0.3), HostStoreClient("127.0.0.1", store.port)
                                                 .key_value_set("k/1", '{"é": [1, 2]}')))
        later.start()
        assert client.blocking_key_value_get("k/1", 10_000) == '{"é": [1, 2]}'
        later.join()
        with pytest.raises(TimeoutError, match="'absent'"):
            client.blocking_key_value_get("absent", 200)
    finally:
        store.close()
