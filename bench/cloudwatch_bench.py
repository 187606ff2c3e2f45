"""CloudWatch publishing: what it costs the exporter, side by side with a gpumon-style publisher in the same run.

Against moto's CloudWatch server on loopback (the tests' double), over the fake driver with the H100 cost profile:
  - the exporter with publishing off, then on (the default metric set, GPU dimension, `--period` seconds at high
    resolution so several periods fit the run): CPU per second and peak RSS of each, the difference being
    publishing's cost (boto3's import is most of the RSS);
  - a gpumon-style loop (the seed AMI's design as its write-up describes it: one PutMetricData call per GPU each
    interval, here with the same four values per GPU read through pynvml from the same fake driver) at the same
    interval: its CPU and requests, next to ours.
Printed: CPU ms per second, peak RSS MiB, requests per period and per month for each.
Run: .venv/bin/python -m bench.cloudwatch_bench [--gpus 8] [--seconds 60] [--period 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
from tests.support.fakenvml import build_fake_nvml  # noqa: E402
from tests.support.processes import cpu_seconds, free_port, peak_rss_kib  # noqa: E402

from bench.exporter_bench import scrape  # noqa: E402

MONTH_SECONDS = 730 * 3600

# One PutMetricData call per GPU per interval with its four values, as the seed AMI's gpumon publishes.
GPUMON_STYLE = textwrap.dedent(
    """
    import resource, sys, time, boto3, pynvml
    endpoint, interval, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    client = boto3.client("cloudwatch", endpoint_url=endpoint, region_name="us-east-1")
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    requests, end = 0, time.monotonic() + seconds
    started = None  # steady state: from the end of the first round (imports and client made)
    while time.monotonic() < end:
        for index, handle in enumerate(handles):
            dims = [{"Name": "InstanceId", "Value": "i-0bench"}, {"Name": "GPUNumber", "Value": str(index)}]
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            data = [
                {"MetricName": "GPU Usage", "Dimensions": dims, "Unit": "Percent", "Value": util.gpu},
                {"MetricName": "Memory Usage", "Dimensions": dims, "Unit": "Percent",
                 "Value": 100.0 * memory.used / memory.total},
                {"MetricName": "Power Usage (Watts)", "Dimensions": dims, "Unit": "None",
                 "Value": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0},
                {"MetricName": "Temperature (C)", "Dimensions": dims, "Unit": "None",
                 "Value": pynvml.nvmlDeviceGetTemperature(handle, 0)},
            ]
            client.put_metric_data(Namespace="gpumon-style", MetricData=data)
            requests += 1
        if started is None:
            started, cpu = time.monotonic(), sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        time.sleep(interval)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    steady = (usage.ru_utime + usage.ru_stime - cpu) / (time.monotonic() - started)
    print(requests, steady, usage.ru_maxrss)
    """
)


def run_exporter(
    env: dict[str, str], work: Path, publishing: dict | None, seconds: float, warm_up: float
) -> tuple[float, float, str, str]:
    """(CPU ms per second, peak RSS MiB, expositions before and after) of the exporter over `seconds`."""
    port = free_port()
    config = work / "accelmon.yml"
    settings: dict = {
        "web": {"listen_address": f"127.0.0.1:{port}"},
        "collectors": {"infiniband": {"enabled": False}, "neuron": {"enabled": False}},
    }
    if publishing:
        settings["cloudwatch"] = publishing
    config.write_text(yaml.safe_dump(settings))
    process = subprocess.Popen([sys.executable, "-m", "accelmon", "--config", str(config)], env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(port)
                break
            except OSError:
                assert time.monotonic() < deadline, "the exporter did not come up"
                time.sleep(0.2)
        time.sleep(warm_up)  # start-up (imports, NVML init, boto3's client) is not steady state
        before = scrape(port).decode()
        begin = cpu_seconds(process.pid)
        time.sleep(seconds)
        used = cpu_seconds(process.pid) - begin
        after = scrape(port).decode()
        return 1000 * used / seconds, peak_rss_kib(process.pid) / 1024, before, after
    finally:
        process.terminate()
        process.wait(10)


def value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--period", type=float, default=10)
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        fake = build_fake_nvml(work / "fakenvml")
        conf = work / "fake-nvml.conf"
        conf.write_text(f"gpus {args.gpus}\ncost h100\n")
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(fake.parent),
            "FAKE_NVML_CONFIG": str(conf),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": str(work / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"),
        }
        publishing = {
            "enabled": True,
            "region": "us-east-1",
            "endpoint_url": endpoint,
            "imds_endpoint": "http://127.0.0.1:9",  # nothing listens: off EC2
            "period_seconds": args.period,
            "storage_resolution": 1,
        }
        off_cpu, off_rss, _, _ = run_exporter(env, work, None, args.seconds, args.period + 2)
        on_cpu, on_rss, before, after = run_exporter(env, work, publishing, args.seconds, args.period + 2)
        success = 'accelmon_cloudwatch_requests_total{outcome="success"}'
        requests = value(after, success) - value(before, success)
        datums = value(after, "accelmon_cloudwatch_datums_sent_total") - value(
            before, "accelmon_cloudwatch_datums_sent_total"
        )
        script = work / "gpumon_style.py"
        script.write_text(GPUMON_STYLE)
        peer = subprocess.run(
            [sys.executable, str(script), endpoint, str(args.period), str(args.seconds)],
            env=env, capture_output=True, text=True, timeout=args.seconds + 120, check=True,
        )  # fmt: skip
        peer_requests, peer_cpu_seconds, peer_rss_kib = peer.stdout.split()
    server.stop()
    periods = args.seconds / args.period
    print(f"{args.gpus} fake H100s (cost model), {args.seconds:g} s, period {args.period:g} s, moto on loopback")
    print(f"exporter, publishing off: {off_cpu:6.1f} ms CPU/s, peak RSS {off_rss:5.1f} MiB")
    print(f"exporter, publishing on:  {on_cpu:6.1f} ms CPU/s, peak RSS {on_rss:5.1f} MiB")
    print(f"  publishing's cost: {on_cpu - off_cpu:+.1f} ms CPU/s, {on_rss - off_rss:+.1f} MiB")
    print(
        f"  {requests:.0f} requests, {datums:.0f} datums sent (statistic sets over every 1 s sample): "
        f"{requests / periods:.1f} requests per period = {requests / periods * MONTH_SECONDS / 60:,.0f}/month at 60 s"
    )
    peer_cpu = 1000 * float(peer_cpu_seconds)
    print(
        f"gpumon-style (one request per GPU per interval): {peer_cpu:6.1f} ms CPU/s, "
        f"peak RSS {int(peer_rss_kib) / 1024:5.1f} MiB, {peer_requests} requests = "
        f"{int(peer_requests) / periods:.1f} per interval = {int(peer_requests) / periods * MONTH_SECONDS / 60:,.0f}"
        "/month at 60 s"
    )


if __name__ == "__main__":
    main()
