"""NCCL's RAS socket of a real job, for docs/hardware.md and the nccl collector's stand-in (tests/support/fake_ras.py).
Run on the GPU machine (one GPU is enough) from the repository root:

    PYTHONPATH=exporters python3 -m bench.nccl_ras_probe [--seconds 20]

Starts a one-process `torch.distributed` job with the NCCL backend (all-reduces in a loop) whose RAS listens where
NCCL_RAS_ADDR says, asks its RAS socket as the collector does (JSON where NCCL has it) and for the text answer, and
keeps both answers, what the collector read from them and the job's NCCL version in --out (default $OUT): ras.json.
Exit status 0 when both answers were read, 1 when RAS did not answer, 2 without PyTorch or a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporters"))
from tests.support.processes import free_port  # noqa: E402

from accelmon.host import nccl_ras  # noqa: E402

JOB = """import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
x = torch.ones(1 << 20, device="cuda")
print("nccl", ".".join(map(str, torch.cuda.nccl.version())), flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    dist.all_reduce(x)
    torch.cuda.synchronize()
dist.destroy_process_group()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the job runs")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".", help="where ras.json is written")
    args = parser.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("no GPU")
    except ImportError as error:
        print(f"nccl_ras_probe: {error}: nothing to ask", file=sys.stderr)
        return 2
    port = free_port()
    env = {**os.environ, "NCCL_RAS_ADDR": f"localhost:{port}", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "RAS"}
    job = subprocess.Popen([sys.executable, "-c", JOB, str(free_port()), str(args.seconds)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    found: dict[str, object] = {"ras_addr": env["NCCL_RAS_ADDR"]}
    try:
        deadline = time.monotonic() + min(60.0, args.seconds)
        while time.monotonic() < deadline:
            try:
                for want in ("json", "text"):
                    began = time.monotonic()
                    form, text = nccl_ras.ask("localhost", port, 10.0, 32 << 20, want=want)
                    status = nccl_ras.parse(form, text, 8)
                    found[want] = {"format": form, "seconds": round(time.monotonic() - began, 4), "answer": text,
                                   "read": [asdict(c) for c in status.communicators]}  # fmt: skip
                break
            except nccl_ras.RasError as error:
                found["last_error"] = str(error)
                time.sleep(1)
    finally:
        job.wait(args.seconds + 60)
        found["job_output"] = (job.stdout.read() if job.stdout else "")[-20000:]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ras.json").write_text(json.dumps(found, indent=2) + "\n")
    print(json.dumps({k: v for k, v in found.items() if k != "job_output"}, indent=2)[:6000])
    return 0 if "json" in found and "text" in found else 1


if __name__ == "__main__":
    sys.exit(main())
