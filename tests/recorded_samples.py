"""Sample workloads recorded as a user records them (``NEURON_RT_INSPECT_ENABLE=1``), once per test session.

The ``recorded_samples`` fixture (conftest.py) hands out one :class:`Recorder`; ``get(*names)`` records
the workloads not recorded yet, all at the same time, each with its own cores, compile cache and live
directory, and returns ``{name: profile.duckdb}``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from filelock import FileLock

import traces

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_workloads"

TWO_TARGETS = textwrap.dedent('''
    """One process, two targets: a trn1 and an inf2 session of one tiny MLP."""
    import sys

    import torch

    import neuron_stack

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    ok = True
    for target, runs in (("trn1", 3), ("inf2", 2)):
        nm = neuron_stack.trace(model, x, target=target)
        for _ in range(runs):
            ok &= torch.allclose(nm(x), model(x), rtol=1e-4, atol=1e-5)
    sys.exit(0 if ok else 1)
''')

#: Runs a workload (``live_dump.py OUT script args...``), then, before its sessions close at exit, writes
#: what its live publishers hold (``traces.live.read_all``: what neuron-monitor reads) to OUT as JSON.
LIVE_DUMP = textwrap.dedent('''
    import json
    import os
    import runpy
    import sys

    from traces import live

    out, sys.argv = sys.argv[1], sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))   # as `python script.py` would
    code = 0
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    for pub in list(live._publishers):
        pub.flush()
    snaps = [{k: v for k, v in s.items() if k != "ring"} for s in live.read_all()]
    with open(out, "w") as f:
        json.dump(snaps, f)
    sys.exit(code)
''')

#: A training script written as AWS's torch-neuronx profiling samples write it: torch.profiler with a
#: schedule, ``record_function`` regions, ``with_stack``, ``device="neuron"``, eager or ``torch.compile``
#: (argv[1]); the compiles happen in the steps before the profiled window. argv[2]: the output directory.
PROFILER_WINDOW = textwrap.dedent('''
    import sys

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    from neuron_stack.profiling import NeuronConfig, NeuronProfiler, ProfileMode

    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step_fn = torch.compile(model) if mode == "compiled" else model
    cfg = NeuronConfig(modes=[ProfileMode.DEVICE, ProfileMode.RUNTIME], profile_output_dir=out)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], experimental_config=cfg,
                 schedule=schedule(wait=1, warmup=1, active=2), on_trace_ready=NeuronProfiler(cfg).export_trace,
                 with_stack=True) as p:
        for step in range(4):
            x = torch.randn(32, 64).to("neuron")
            y = torch.randint(0, 10, (32,)).to("neuron")
            with record_function("forward"):
                loss = torch.nn.functional.cross_entropy(step_fn(x), y)
            with record_function("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            p.step()
''')

#: name -> command line after the interpreter (two_targets.py is written into the recording directory).
WORKLOADS = {
    "fallback": [str(SAMPLES / "fallback.py"), "--small"],
    "dynamic_shapes": [str(SAMPLES / "dynamic_shapes.py"), "--small"],
    "tensor_parallel": [str(SAMPLES / "tensor_parallel.py"), "--small"],
    "train_mlp": [str(SAMPLES / "train_mlp.py"), "--small"],
    "two_targets": ["two_targets.py"],
    "bert_encoder": [str(SAMPLES / "bert_encoder.py"), "--small"],
}


#: Variables that would pick the cores or instance for the workloads: each records on its own instance.
CORE_VARIABLES = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES", "NEURON_STACK_INSTANCE_TYPE")


class Recorder:
    """Records workloads on demand and remembers the profiles.

    Under pytest-xdist the workers share ``shared``: the first worker to ask for a workload records it there
    (under a file lock) and every worker reads its own copy in ``root``, so a run records each workload once
    and no worker's reads meet another's writes (annotations, names) on one file."""

    def __init__(self, root: Path, shared: Path | None = None):
        self.root = Path(root)
        self.shared = Path(shared or root)
        self.shared.mkdir(parents=True, exist_ok=True)
        self.profiles: dict[str, Path] = {}
        with FileLock(self.shared / "recorder.lock"):
            for name, text in (("two_targets.py", TWO_TARGETS), ("live_dump.py", LIVE_DUMP),
                               ("profiler_window.py", PROFILER_WINDOW)):
                if not (self.shared / name).exists():
                    (self.shared / name).write_text(text)

    def live_file(self, name: str) -> Path:
        """The live snapshots ``name`` published, as it ended (JSON list, ring buffers left out)."""
        return self.root / f"{name}.live.json"

    def _record(self, procs: dict[str, subprocess.Popen], profile) -> None:
        """Wait for ``procs`` and write each one's marker: its profile's path under ``shared``."""
        for key, proc in procs.items():
            text, _ = proc.communicate(timeout=600)
            assert proc.returncode == 0, f"{key}: {text[-2000:]}"
            (self.shared / f"{key}.done").write_text(str(profile(key).relative_to(self.shared)))

    def _take(self, keys) -> None:
        """This worker's copies of the recorded ``keys`` (their directories and live files)."""
        for key in (k for k in keys if k not in self.profiles):
            path = self.shared / (self.shared / f"{key}.done").read_text()
            if self.shared != self.root:
                shutil.copytree(self.shared / key, self.root / key, dirs_exist_ok=True)
                if (live := self.shared / f"{key}.live.json").exists():
                    shutil.copy(live, self.root / live.name)
                path = self.root / path.relative_to(self.shared)
            self.profiles[key] = path

    def windows(self, *modes: str) -> dict[str, Path]:
        """``{mode: profile.duckdb}``: the one torch.profiler window :data:`PROFILER_WINDOW` records in each
        ``mode`` (``eager``, ``compiled``), run side by side, profiling off outside the window."""
        keys = [f"window_{m}" for m in modes]
        with FileLock(self.shared / "recorder.lock"):
            procs = {}
            for mode in (m for m in modes if not (self.shared / f"window_{m}.done").exists()):
                env = {k: v for k, v in os.environ.items()
                       if k not in CORE_VARIABLES and not k.startswith("NEURON_RT_")}
                env.update(NEURON_STACK_RUNTIME_DIR=str(self.shared / f"window_{mode}.cores"),
                           NEURON_STACK_LIVE_DIR=str(self.shared / f"window_{mode}.live"),
                           NEURON_COMPILE_CACHE_URL=str(self.shared / f"window_{mode}.cache"),
                           PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
                cmd = [sys.executable, "profiler_window.py", mode, str(self.shared / f"window_{mode}")]
                procs[f"window_{mode}"] = subprocess.Popen(cmd, cwd=self.shared, env=env, stdout=subprocess.PIPE,
                                                           stderr=subprocess.STDOUT, text=True)
            self._record(procs, lambda key: min((self.shared / key).glob("*/*/profile.duckdb")))
        self._take(keys)
        return {m: self.profiles[f"window_{m}"] for m in modes}

    def get(self, *names: str) -> dict[str, Path]:
        """``{name: profile.duckdb}`` for ``names``, recording the missing ones side by side."""
        with FileLock(self.shared / "recorder.lock"):
            procs = {}
            for name in (n for n in names if not (self.shared / f"{n}.done").exists()):
                env = {k: v for k, v in os.environ.items() if k not in CORE_VARIABLES}
                env.update(NEURON_RT_INSPECT_ENABLE="1", NEURON_RT_INSPECT_DEVICE_PROFILE="session",
                           NEURON_RT_INSPECT_OUTPUT_DIR=str(self.shared / name),
                           NEURON_STACK_RUNTIME_DIR=str(self.shared / f"{name}.cores"),
                           NEURON_STACK_LIVE_DIR=str(self.shared / f"{name}.live"),
                           NEURON_COMPILE_CACHE_URL=str(self.shared / f"{name}.cache"),
                           PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
                procs[name] = subprocess.Popen([sys.executable, "live_dump.py", str(self.shared / f"{name}.live.json"),
                                                *WORKLOADS[name]], cwd=self.shared, env=env,
                                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self._record(procs, lambda key: traces.finalize(self.shared / key))
        self._take(names)
        return {n: self.profiles[n] for n in names}
