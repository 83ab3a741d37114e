#!/usr/bin/env python3
"""`semflow bench throughput` on the CUDA backend with half the requests held to JSON output
(the demo model and its tokenizer): every row is drawn by the GPU's sampler with the forms'
allow masks, steps with forms' rows are queued ahead of the ids before them, and the masks made
after those ids, while the step's forward pass runs on the device, are counted apart from the
host's gap on the device's critical path (engine.phases_ms: masks_beside_forward beside
device_idle_gap, both inside the decode step). Prints PASS:/FAIL: lines like the C tests."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
BUILD = os.environ.get("SF_BUILD", os.path.join(os.getcwd(), "build"))
os.environ.setdefault("SEMFLOW_BIN", os.path.join(BUILD, "semflow"))
from sftest import check, results, run  # noqa: E402

rc, out, err = run("bench", "throughput", "--model", "demo", "--backend", "cuda", "--num-prompts", "32",
                   "--input", "16", "--output", "48", "--structured-output-ratio", "0.5", "--json", timeout=300)
try:
    r = json.loads(out) if rc == 0 else None
except ValueError:
    r = None
e = r["engine"] if r else {}
ph = e.get("phases_ms", {})
check("forms_drawn_on_the_gpu", r is not None and r["json_requests"] == 16 and e.get("sampling") == "backend"
      and e.get("rows_sampled_host") == 0 and e.get("async_form_steps", 0) > 0, f"rc {rc}: {r or err[-400:]}")
masks, gap, step = ph.get("masks_beside_forward", -1), ph.get("device_idle_gap", -1), e.get("decode_step_ms", 0)
print(f"  decode step {step:.4f} ms: host gap {gap:.4f} ms, forms' masks beside the forward pass {masks:.4f} ms; "
      f"{e.get('async_form_steps')} of {e.get('async_steps')} steps ahead had forms' rows")
check("masks_counted_apart_from_the_gap", masks > 0 and gap >= 0 and gap + masks <= step * 1.0001,
      f"masks {masks}, gap {gap}, step {step}")
sys.exit(1 if results.failures else 0)
