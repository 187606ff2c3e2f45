"""bench/deploy_bench.py's model of a fleet's deploy time: Ansible's batches and the arithmetic of T(N)."""

from __future__ import annotations

import pytest
from bench.deploy_bench import BATCHES, batch_sizes, deploy_seconds, fleet_seconds, summarise


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [(1, [1]), (3, [1, 1, 1]), (100, [1, 5, 25, 69]), (2000, [1, 100, 500, 1399]), (20000, [1, 1000, 5000, 13999])],
)
def test_the_batches_are_the_ones_serial_makes(hosts, expected):
    assert batch_sizes(hosts, BATCHES) == expected
    assert sum(expected) == hosts


def test_the_batches_are_ansibles_own():
    """The same batches as ansible-core's own splitting of a play's hosts (where the controller's Ansible is)."""
    executor = pytest.importorskip("ansible.executor.playbook_executor")

    class Inventory:
        def __init__(self, hosts: int) -> None:
            self.hosts = hosts

        def get_hosts(self, pattern: object, order: object = None) -> list[int]:
            return list(range(self.hosts))

    class Play:
        hosts, order, serial = "worker", None, BATCHES

    for hosts in (1, 7, 99, 2000, 20000):
        playbook = executor.PlaybookExecutor.__new__(executor.PlaybookExecutor)
        playbook._inventory = Inventory(hosts)
        assert [len(b) for b in playbook._get_serialized_batches(Play())] == batch_sizes(hosts, BATCHES)


def test_a_batch_takes_its_rounds_of_latency_or_its_controller_cpu_over_the_cores():
    # 100 hosts: batches 1, 5, 25, 69; 10 tasks a host of 1 s each, 0.2 CPU-s each on the controller, 50 forks.
    inputs = {"tasks": 10, "controller_cpu": 2.0, "latency": 1.0, "forks": 50}
    # 8 cores: latency bound, 1 round per task for the first three batches, 2 for 69 hosts (1.7 s of CPU).
    assert deploy_seconds(100, cores=8, **inputs) == pytest.approx(10 + 10 + 10 + 20)
    # 1 core: CPU bound from the 5-host batch on (5 x 0.2 = 1 s a task, 25 x 0.2 = 5 s, 69 x 0.2 = 13.8 s).
    assert deploy_seconds(100, cores=1, **inputs) == pytest.approx(10 + 10 + 50 + 138)
    # 2 of the 10 in the preflight play, all 100 hosts at once (2 rounds, or 20 s of CPU on 1 core), 8 in batches.
    assert deploy_seconds(100, cores=8, preflight_tasks=2, **inputs) == pytest.approx(2 * 2.5 + 8 * 5)
    assert deploy_seconds(100, cores=1, preflight_tasks=2, **inputs) == pytest.approx(2 * 20 + 8 * (1 + 1 + 5 + 13.8))
    # The main process, one core whatever the cores: 0.05 CPU-s a host-task makes the 69-host batch's task 3.45 s.
    assert deploy_seconds(100, cores=8, main_cpu=0.05, **inputs) == pytest.approx(10 + 10 + 10 * 1.25 + 10 * 3.45)


def test_the_controllers_cpu_is_the_forks_own_the_delegated_modules_and_a_share_of_the_main_process():
    records = [
        {"host": "w1", "task": "a", "play": "Workers", "delegated": False, "run_once": False, "wall": 2.0, "cpu": 0.1,
         "children_cpu": 0.5, "rss_kib": 1024},
        {"host": "w1", "task": "check", "play": "Preflight", "delegated": True, "run_once": False, "wall": 1.0,
         "cpu": 0.1, "children_cpu": 1.0, "rss_kib": 1024},
        {"host": "w2", "task": "a", "play": "Workers", "delegated": False, "run_once": False, "wall": 4.0, "cpu": 0.3,
         "children_cpu": 0.7, "rss_kib": 2048},
        {"host": "w1", "task": "wheel", "play": "Workers", "delegated": True, "run_once": True, "wall": 9.0, "cpu": 0.5,
         "children_cpu": 5.0, "rss_kib": 1024},
        {"main": True, "wall": 20.0, "rc": 0, "cpu": 4.0, "rss_kib": 102400},
    ]  # fmt: skip
    run = summarise(records)
    assert run.hosts == 2 and run.tasks_per_host == 1.5 and run.preflight_tasks_per_host == 0.5
    # (0.1 + 0.1 + 1.0 + 0.3 + 4.0) / 2: a remote module's CPU is the worker's, not the controller's.
    assert run.controller_cpu_per_host == pytest.approx(2.75)
    assert run.remote_cpu_per_task == pytest.approx(0.6) and run.latency_per_task == pytest.approx(3.0)
    assert run.once_cpu == pytest.approx(5.5) and run.main_rss_mib == 100


def test_the_sharded_deploy_is_its_preflight_stage_the_canary_and_the_shards_side_by_side():
    """scripts/deploy_fleet.py's stages. 9 hosts, 2 shards: preflight stage 5 hosts a shard; canary 1 host; the other 8
    in shards of 4, each its preflight on 4 then batches of 5 %, 25 %, 100 % of 4: 1, 1, 2. 10 tasks (2 preflight),
    1 s latency, 0.2 CPU-s a host-task on the controller."""
    inputs = {"tasks": 10, "preflight_tasks": 2, "controller_cpu": 2.0, "latency": 1.0, "main_cpu": 0.0}
    # Latency bound (50 forks, 8 cores): every task one round.
    assert fleet_seconds(9, shards=2, forks=50, cores=8, **inputs) == pytest.approx(2 + 10 + 2 + 8 * 3)
    # 1 core: the two shards' forks share it. Preflight stage 2 shards x 5 hosts x 0.2 = 2 s a task; canary 1 s;
    # each shard's preflight 2 x 4 x 0.2 = 1.6 s; its batches of 1, 1, 2 hosts (0.4, 0.4, 0.8 s of CPU): 1 s each.
    assert fleet_seconds(9, shards=2, forks=50, cores=1, **inputs) == pytest.approx(2 * 2 + 10 + 2 * 1.6 + 8 * 3)
    # Each shard's main process is its own core: 0.5 CPU-s a host-task makes a 4-host task 2 s, not 2 shards x 2.
    main = {**inputs, "main_cpu": 0.5}
    assert fleet_seconds(9, shards=2, forks=50, cores=64, **main) == pytest.approx(
        2 * 2.5 + 10 + 2 * 2 + 8 * (1 + 1 + 1)
    )
    # One shard of the same fleet pays every host-task on one main process.
    assert fleet_seconds(9, shards=1, forks=50, cores=64, **main) > fleet_seconds(
        9, shards=2, forks=50, cores=64, **main
    )
