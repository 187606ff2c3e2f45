"""The capacity bench's simulated fleet (bench/master_capacity.py) is a healthy one unless asked otherwise: a port's
state, a link's width and an error counter stay as the exporter served them, so the path rules and alerts cost what
they cost on a sound fleet; --faults keeps the fleet in trouble (issue 68, point 10: with every value wandering, every
GPU of the simulated fleet had 5 path faults)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e  # the bench imports the dashboards' generator (the controller's grafana SDK)

RECORDED = """\
# TYPE accelmon_infiniband_state_id gauge
accelmon_infiniband_state_id{device="mlx5_0",port="1"} 4
accelmon_gpu_pcie_link_width{gpu="0",uuid="G0"} 16
accelmon_gpu_pcie_link_width_max{gpu="0",uuid="G0"} 16
accelmon_infiniband_rate_bytes_per_second{device="mlx5_0",port="1"} 5e+10
accelmon_infiniband_port_saturated{counter="link_downed",device="mlx5_0",port="1"} 1
accelmon_infiniband_symbol_error_total{device="mlx5_0",port="1"} 10
accelmon_infiniband_port_transmit_wait_total{device="mlx5_0",port="1"} 10
accelmon_gpu_power_watts{gpu="0",uuid="G0"} 300
accelmon_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"} 1e+06
"""
STILL = [line.rsplit(" ", 1)[0] for line in RECORDED.splitlines()[1:7]]


def served(body, worker: int, scrape: int) -> dict[str, float]:
    text = body.render(worker, scrape).decode()
    return {s: float(v) for s, v in (line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))}


def test_a_healthy_fleet_keeps_states_limits_and_error_counters_as_served():
    from bench.master_capacity import MovingBody

    body = MovingBody(RECORDED)
    scrapes = [served(body, worker, scrape) for worker in range(4) for scrape in range(1, 6)]
    recorded = {s: float(v) for s, v in (line.rsplit(" ", 1) for line in RECORDED.splitlines()[1:])}
    for series in STILL:
        assert {s[series] for s in scrapes} == {recorded[series]}, series
    assert len({s['accelmon_gpu_power_watts{gpu="0",uuid="G0"}'] for s in scrapes}) > 1  # gauges still move
    data = 'accelmon_infiniband_port_data_transmitted_bytes_total{device="mlx5_0",port="1"}'
    assert served(body, 0, 2)[data] > served(body, 0, 1)[data]  # and traffic counters grow


def test_faults_lets_states_and_error_counters_wander():
    from bench.master_capacity import MovingBody

    body = MovingBody(RECORDED, faults=True)
    scrapes = [served(body, 0, scrape) for scrape in range(1, 6)]
    assert {s['accelmon_infiniband_state_id{device="mlx5_0",port="1"}'] for s in scrapes} != {4.0}
    symbol = 'accelmon_infiniband_symbol_error_total{device="mlx5_0",port="1"}'
    assert scrapes[-1][symbol] > scrapes[0][symbol]


def test_a_share_of_the_fleet_in_trouble_is_spread_over_it_the_rest_healthy():
    from bench.master_capacity import Fleet

    gpus = "".join(f'accelmon_gpu_up{{gpu="{g}",uuid="G{g}"}} 1\n' for g in range(8))
    fleet = Fleet({"accelmon": RECORDED + gpus, "node": "node_load1 1.5\n"}, faults=0.25)
    try:
        state = 'accelmon_infiniband_state_id{device="mlx5_0",port="1"}'

        def states(worker: int) -> set[float]:
            return {
                float(line.rsplit(" ", 1)[1])
                for scrape in range(1, 6)
                for line in fleet.body(worker, "accelmon", scrape).decode().splitlines()
                if line.startswith(state)
            }

        troubled = [worker for worker in range(12) if states(worker) != {4.0}]
        assert troubled == [0, 4, 8]
        assert b"accelmon_gpu_job_info" in fleet.body(5, "accelmon", 1)  # the healthy ones still serve their jobs
    finally:
        fleet.server_close()


@pytest.mark.parametrize(("share", "workers", "expected"), [(0.7, 10, 7), (0.6, 10, 6), (0.3, 10, 3), (0.05, 1000, 50)])
def test_faults_puts_its_share_of_the_workers_in_trouble_at_every_step(share, workers, expected):
    """`--faults SHARE` is the share of the workers in trouble. One in round(1 / SHARE) was every worker for any share
    over 2/3 (0.7: all 10), half of them from 0.4 to 2/3 (0.6: 5 of 10) and 1 in 3 at 0.3 (4 of 10)."""
    from bench.master_capacity import Fleet

    fleet = Fleet({"node": "node_load1 1.5\n"}, faults=share)
    try:
        troubled = [worker for worker in range(workers) if fleet.in_trouble(worker)]
        assert len(troubled) == expected, troubled
        assert troubled[0] == 0  # the first step's workers include one in trouble
        # spread over the fleet: each tenth of it holds its share, as the bench's steps add workers
        tenth = workers // 10
        for end in range(tenth, workers, tenth):
            assert abs(sum(map(fleet.in_trouble, range(end))) - share * end) < 1, end
    finally:
        fleet.server_close()
