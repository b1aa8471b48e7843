"""``python -m neuron_stack.compat SCRIPT [ARGS]`` or ``python -m neuron_stack.compat -m MODULE [ARGS]``:
run a script written for the real Neuron SDK with its import names resolving to this stack (see
:mod:`neuron_stack.compat`)."""
from __future__ import annotations

import os
import runpy
import sys

from neuron_stack.compat import install

USAGE = "usage: python -m neuron_stack.compat SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\nRuns a script written for the Neuron SDK (nki, neuronxcc.nki, torch_neuronx, torch_xla) "
              "on neuron_stack, unchanged.")
        return 0 if argv else 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print(f"neuron_stack.compat: -m needs a module name; {USAGE}", file=sys.stderr)
            return 2
        install()
        sys.argv = argv[1:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    script = argv[0]
    if not os.path.isfile(script):
        print(f"neuron_stack.compat: {script}: no such file; {USAGE}", file=sys.stderr)
        return 2
    install()
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))     # as `python script.py` does
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
