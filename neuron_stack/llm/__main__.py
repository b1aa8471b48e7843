"""``python -m neuron_stack.llm project ...``: the ``neuron-llm`` command."""

import sys

from neuron_stack.llm.cli import main

sys.exit(main())
