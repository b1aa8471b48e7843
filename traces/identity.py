"""One instance identity: which simulated instance a tool reports, decided the same way by ``neuron-ls``,
``neuron-monitor``, ``neuron-top``, the Explorer and the profile.

A process decides once, when its runtime reserves cores (``neuron_stack.runtime.cores.get_instance``):
``NEURON_STACK_INSTANCE_TYPE``, else ``NEURON_STACK_TARGET``'s default instance, else the target of its own
graphs' default instance; it publishes that identity in its live snapshot and writes it into its profile.
A tool with no graphs of its own (:func:`machine`) takes the variables the same way, else the identity of the
processes running now (the oldest first; a machine running several targets reports each process under its own,
``instances`` lists them), else the documented default. Nothing depends on which workload wrote a shared file
last: each instance type's description is its own file (``traces.live.read_device_info``).

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> machine([], d, env={"NEURON_STACK_TARGET": "inf2"})["instance_type"]
'inf2.48xlarge'
>>> machine([{"instance_type": "trn1.2xlarge", "target": "trn1", "hardware": {"neuron_device_count": 1}}], d,
...         env={})["instance_type"]
'trn1.2xlarge'
"""
from __future__ import annotations

import os

from traces.live import read_device_info

#: Each target's default instance (``neuron_stack.device.profiles``; tests/test_identity.py checks they agree).
DEFAULT_INSTANCE = {"trn1": "trn1.32xlarge", "inf2": "inf2.48xlarge", "trn2": "trn2.48xlarge"}
#: With no variable and no process: the runtime's default target.
DEFAULT_TARGET = "trn1"


def machine(snaps: list[dict], directory=None, env=None) -> dict:
    """The identity a tool without graphs reports: ``{"instance_type", "target", "hardware", "instances"}``
    (``hardware`` empty when no workload has described that instance yet; ``instances``: every instance type
    of the processes running now, oldest first). ``snaps``: :func:`traces.live.read_all`'s snapshots."""
    env = os.environ if env is None else env
    itype = env.get("NEURON_STACK_INSTANCE_TYPE", "").strip()
    target = env.get("NEURON_STACK_TARGET", "").strip()
    running = [s for s in snaps if s.get("instance_type")]
    instances = list(dict.fromkeys(s["instance_type"] for s in running))
    if not itype and target:
        itype = next((s["instance_type"] for s in running if s.get("target") == target),
                     DEFAULT_INSTANCE.get(target, ""))
    if not itype:
        itype = instances[0] if instances else DEFAULT_INSTANCE[DEFAULT_TARGET]
    own = next((s for s in running if s["instance_type"] == itype and s.get("hardware")), None)
    info = own or read_device_info(itype, directory) or {}
    return {"instance_type": itype, "target": str(info.get("target", target)),
            "hardware": dict(info.get("hardware") or {}), "instances": instances}
