"""The graph partitioner's configuration and the operator-support analysis, as ``torch_neuronx``
has them: :class:`PartitionerConfig`, :func:`check_partitioner_config` (applied to a compiled
program) and :func:`analyze` / :func:`support_report` (``torch_neuronx.analyze``'s report).

>>> from neuron_stack.ir import Node, Program
>>> support_counts(Program("g", [Node("r", "aten.relu.default"), Node("a", "operator.add")], [], []))
{'aten::relu': [1, 0]}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from neuron_stack.compiler.legalize import aten_name, legalize
from neuron_stack.compiler.version import compiler_version, stack_version
from neuron_stack.frontend.export import capture
from neuron_stack.ir import Program


class PartitionerError(ValueError):
    """A model that does not meet its ``partitioner_config``; one line naming the figure and the fix."""


#: ``analyze_parameters`` keys the real graph partitioner accepts (the other ``analyze`` kwargs it refuses).
ANALYZE_PARAMETERS = ("compiler_workdir", "additional_ignored_ops", "max_workers")
#: ``trace_kwargs`` keys: the ``trace`` arguments that apply to the Neuron subgraphs.
TRACE_KWARGS = ("compiler_args", "compiler_workdir")


@dataclass(kw_only=True)
class PartitionerConfig:
    """The graph partitioner's configuration, as ``torch_neuronx.PartitionerConfig`` (keyword-only).

    - ``ops_to_partition``: ATen ops (``"aten::sort"``) forced to the CPU whatever their support.
    - ``model_support_percentage_threshold`` (0..1, default 0.5): refuse to compile when a smaller
      share of the ops (as ``analyze`` counts them) is supported by the NeuronCore.
    - ``min_subgraph_size`` (``-1`` or >= 1): refuse when any subgraph, NeuronCore or CPU, has
      fewer ops. ``max_subgraph_count`` (``-1`` or >= 1): refuse when there are more subgraphs.
    - ``analyze_parameters``: ``compiler_workdir`` (gets ``analyze.json``, the support report),
      ``additional_ignored_ops`` (left out of the share), ``max_workers`` (accepted; our analysis
      is one pass). ``trace_kwargs``: ``compiler_args`` / ``compiler_workdir`` for the trace.
    A fully supported model with nothing forced is one graph and skips the checks, as in torch_neuronx.
    Any violation raises :class:`PartitionerError` (a ValueError), one line.

    >>> PartitionerConfig(ops_to_partition={"aten::sort"}, max_subgraph_count=3).min_subgraph_size
    -1
    >>> PartitionerConfig(min_subgraph_size=0)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    neuron_stack.compiler.support.PartitionerError: partitioner_config.min_subgraph_size must be -1 (no minimum)
    or >= 1, not 0
    """

    trace_kwargs: dict | None = None
    model_support_percentage_threshold: float = 0.5
    min_subgraph_size: int = -1
    max_subgraph_count: int = -1
    ops_to_partition: set | None = field(default_factory=set)
    analyze_parameters: dict | None = None

    def __post_init__(self):
        self.ops_to_partition = set(self.ops_to_partition or ())
        bad = [o for o in self.ops_to_partition if not str(o).startswith("aten::")]
        if bad:
            raise PartitionerError(f"ops_to_partition entry {bad[0]!r} is not an ATen op name: spell it like "
                                   "'aten::sort'")
        t = self.model_support_percentage_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1:
            raise PartitionerError(f"partitioner_config.model_support_percentage_threshold must be a number "
                                   f"between 0 and 1 (0.5 = half the ops supported), not {t!r}")
        for name in ("min_subgraph_size", "max_subgraph_count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or v >= 1):
                what = "minimum" if name.startswith("min") else "maximum"
                raise PartitionerError(f"partitioner_config.{name} must be -1 (no {what}) or >= 1, not {v!r}")
        for name, allowed in (("analyze_parameters", ANALYZE_PARAMETERS), ("trace_kwargs", TRACE_KWARGS)):
            given = getattr(self, name)
            if given is not None and not isinstance(given, dict):
                raise PartitionerError(f"partitioner_config.{name} must be a dict, not {type(given).__name__}")
            for key in given or {}:
                if key not in allowed:
                    raise PartitionerError(f"partitioner_config.{name} key {key!r} is not supported by the graph "
                                           f"partitioner: use {', '.join(allowed)}")
        workers = (self.analyze_parameters or {}).get("max_workers", 1)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise PartitionerError(f"partitioner_config.analyze_parameters max_workers must be an integer >= 1, "
                                   f"not {workers!r}")


#: Symbolic-shape bookkeeping export adds around data-dependent ops: not operators of the model.
SHAPE_BOOKKEEPING = frozenset({"aten::sym_size", "aten::sym_numel", "aten::sym_stride", "aten::_assert_scalar",
                               "aten::_assert_async", "aten::sym_constrain_range_for_size",
                               "aten::_assert_tensor_metadata"})


def support_op_name(n) -> str | None:
    """The ``aten::name`` a node counts as in the support share, or None (Python scalar ops such as
    ``operator.add`` and shape bookkeeping do not count, as in ``torch_neuronx.analyze``)."""
    if not n.is_compute:
        return None
    name = aten_name(n.target)
    return name if name.startswith("aten::") and name not in SHAPE_BOOKKEEPING else None


def support_counts(program: Program) -> dict[str, list[int]]:
    """``{"aten::addmm": [on_device, on_cpu], ...}`` over the model's ATen ops as currently placed.

    >>> from neuron_stack.ir import Node, Program
    >>> support_counts(Program("g", [Node("r", "aten.relu.default"), Node("a", "operator.add")], [], []))
    {'aten::relu': [1, 0]}
    """
    counts: dict[str, list[int]] = {}
    for n in program.nodes:
        name = support_op_name(n)
        if name is not None:
            counts.setdefault(name, [0, 0])[n.placement != "device"] += 1
    return dict(sorted(counts.items()))


def support_share(counts: dict[str, list[int]], ignored=frozenset()) -> tuple[float, int, int]:
    """``(percent, supported, total)`` of ops the NeuronCore supports, ``ignored`` ops left out
    (``analyze``'s ``additional_ignored_ops``). Example: ``support_share({"aten::sort": [0, 1]})``
    -> ``(0.0, 0, 1)``."""
    supported = sum(c[0] for op, c in counts.items() if op not in ignored)
    total = sum(c[0] + c[1] for op, c in counts.items() if op not in ignored)
    return (100.0 * supported / total if total else 100.0), supported, total


def describe_support(counts: dict[str, list[int]], ignored=frozenset()) -> tuple[float, str]:
    """``(percent, "model support percentage of 81.82% (9 of 11 ops supported; unsupported: ...)")``."""
    pct, supported, total = support_share(counts, ignored)
    unsupported = ", ".join(f"{op} x{c[1]}" if c[1] > 1 else op for op, c in counts.items()
                            if c[1] and op not in ignored)
    return pct, f"model support percentage of {pct:.2f}% ({supported} of {total} ops supported" + (
        f"; unsupported: {unsupported})" if unsupported else ")")


def check_partitioner_config(program: Program, config) -> str:
    """Apply a ``PartitionerConfig``'s limits to a compiled program, as ``torch_neuronx`` does.

    The support share is that of ``analyze`` (before ``ops_to_partition``; stored by the compiler in
    ``program.stats["support"]``). A fully supported model with nothing forced to the CPU is one
    graph and is not checked further; otherwise the share must reach
    ``model_support_percentage_threshold`` (and exceed 2%), every subgraph (device or CPU) must hold
    at least ``min_subgraph_size`` ops and there may be at most ``max_subgraph_count`` subgraphs.
    Returns a one-line summary; raises :class:`PartitionerError`.
    Example: ``check_partitioner_config(neff.program, PartitionerConfig(max_subgraph_count=3))``.
    """
    counts = program.stats.get("support") or support_counts(program)
    ignored = set((config.analyze_parameters or {}).get("additional_ignored_ops") or ())
    pct, share = describe_support(counts, ignored)
    forced = bool(config.ops_to_partition)
    if abs(pct - 100.0) < 1e-4 and not forced:
        return f"partitioner: {share}: the whole model is one NeuronCore graph"
    if pct <= 2:
        raise PartitionerError(f"{share} is very close to 0%: aborting the trace; nothing worth running on the "
                               "NeuronCore (run the model on the CPU, or replace the unsupported ops)")
    threshold = 100.0 * config.model_support_percentage_threshold
    if pct < threshold:
        raise PartitionerError(f"{share} is below partitioner_config.model_support_percentage_threshold "
                               f"of {threshold:.2f}%: replace the unsupported ops, or lower the threshold")
    parts = program.partitions
    if config.min_subgraph_size != -1:
        by_name = {n.name: n for n in program.nodes}
        for p in parts:
            size = sum(support_op_name(by_name[n]) is not None for n in p.nodes)
            if size < config.min_subgraph_size:
                kind = "NEURON" if p.kind == "device" else "CPU"
                raise PartitionerError(
                    f"the partitioner created a {kind} subgraph (#{p.index}) with {size} operators, less than "
                    f"partitioner_config.min_subgraph_size of {config.min_subgraph_size}: lower min_subgraph_size, "
                    "or move neighbouring ops with ops_to_partition so the subgraphs merge")
    if config.max_subgraph_count != -1 and len(parts) > config.max_subgraph_count:
        layout = " | ".join("NEURON" if p.kind == "device" else "CPU" for p in parts)
        raise PartitionerError(
            f"the partitioner found {len(parts)} subgraphs ({layout}), more than "
            f"partitioner_config.max_subgraph_count of {config.max_subgraph_count}: raise max_subgraph_count, "
            "or force the ops between the CPU islands to the CPU with ops_to_partition")
    return (f"partitioner: {share} >= threshold {threshold:.2f}%; {len(parts)} subgraphs "
            f"(min size {config.min_subgraph_size}, max count {config.max_subgraph_count})")


# -- torch_neuronx.analyze ----------------------------------------------------------------------

_DATA_DEP_AT = "Lowering to HLO"


def analyze(model, example_inputs, compiler_workdir=None, additional_ignored_ops=frozenset(),
            max_workers: int = 4, is_hf_transformers: bool = False, cleanup: bool = False) -> dict:
    """The operator-support report of ``torch_neuronx.analyze`` for ``model`` on ``example_inputs``.

    Returns ``{"torch_neuronx_version", "neuronx_cc_version", "support_percentage",
    "supported_operators": {"aten::addmm": 3, ...}, "unsupported_operators": [{"kind",
    "failureAt", "call", "opGraph"}]}``; ``call`` is the user's ``file(line): function`` stack.
    ``additional_ignored_ops`` are left out of the report; ``compiler_workdir`` gets it as
    ``analyze.json``. ``max_workers``, ``is_hf_transformers`` and ``cleanup`` are accepted for
    compatibility: the analysis here is one pass with no worker threads or artifacts to clean.

    >>> r = analyze(torch.nn.Linear(4, 2), torch.randn(1, 4))     # doctest: +SKIP
    >>> r["support_percentage"]                                    # doctest: +SKIP
    '100.00%'
    """
    program = capture(model, example_inputs)
    legalize(program)
    report = support_report(program, set(additional_ignored_ops or ()))
    if compiler_workdir is not None:
        wd = Path(compiler_workdir)
        wd.mkdir(parents=True, exist_ok=True)
        (wd / "analyze.json").write_text(json.dumps(report, indent=2))
    return report


def support_report(program, ignored=frozenset()) -> dict:
    """The ``analyze`` report of a legalized program; ops forced to the CPU by ``ops_to_partition``
    count as supported (the share is of what the NeuronCore *could* run). ``ignored``: ATen
    names (``aten::sort``) left out. Example: ``support_report(neff.program)["support_percentage"]``.
    """
    supported: dict[str, int] = {}
    unsupported = []
    for n in program.nodes:
        name = support_op_name(n)
        if name is None or name in ignored:
            continue
        if n.placement == "device" or "ops_to_partition" in n.fallback_reason:
            supported[name] = supported.get(name, 0) + 1
            continue
        src = n.source
        call = f"{src.file}({src.line}): {src.function}\n" if src else ""
        ins = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in n.inputs)
        outs = ", ".join(f"{tuple(s.shape)} {s.dtype}" for s in n.outputs)
        unsupported.append({
            "kind": name,
            "failureAt": _DATA_DEP_AT if "data-dependent" in n.fallback_reason else "neuronx-cc",
            "call": call, "reason": n.fallback_reason, "module": n.module_path,
            "opGraph": f"graph({ins}):\n  %{n.name} = {n.target}(...) -> ({outs})"})
    total = sum(supported.values()) + len(unsupported)
    pct = 100.0 * sum(supported.values()) / total if total else 100.0
    return {"torch_neuronx_version": stack_version(), "neuronx_cc_version": compiler_version(),
            "support_percentage": f"{pct:.2f}%", "supported_operators": dict(sorted(supported.items())),
            "unsupported_operators": unsupported}
