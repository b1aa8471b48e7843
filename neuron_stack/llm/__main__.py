"""``python -m neuron_stack.llm project ...``: the ``neuron-llm`` command."""
import sys

from .cli import main

sys.exit(main())
