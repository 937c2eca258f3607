"""Runs a script on two real OpenCL devices: PoCL's ``POCL_DEVICES="pthread pthread"`` gives two,
but only when set before PoCL starts, so the script runs in a process of its own. It prints one
JSON line last, which comes back as a dict."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Picks the first platform with two devices (the scripts start with it).
PAIR = """
import clkernels
by_platform = {}
for d in clkernels.list_devices():
    by_platform.setdefault(d.platform.int_ptr, []).append(d)
pair = next(ds for ds in by_platform.values() if len(ds) >= 2)[:2]
"""


def run_on_two_devices(script: str) -> dict:
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    env.pop("PYCLAD_DEVICE", None)
    env.pop("PYOPENCL_CTX", None)
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", PAIR + script], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
