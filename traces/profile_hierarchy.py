"""The real Neuron Explorer's hierarchy and source tables over ours: ``FrameworkNode`` (our ``nn.Module`` paths),
``HloInstruction`` (our ops: the ATen level that sits where HLO does), ``StackFrame*`` (the user's source
lines) and ``Kernel*`` (NKI kernel lines), schema 7.4.0. Each node's figures come from its instructions'
merged time intervals (:func:`traces.profile_tables.islands`), as the real tool's "time_intervals".

>>> [f.name for f in STACK_FRAME.fields]
['id', 'file_location_id', 'parent_frame_id']
"""
from __future__ import annotations

from traces.profile_tables import _DMA_SOURCE, _PEAK_PER_NS, _meta, islands
from traces.real_fields import _B, _NS, _PCORE, HBM_READ, HBM_WRITE, F, Table
from traces.vocab import COMPUTE_ENGINES

#: One row per device instruction with what the hierarchy tables add up (the node it belongs to: ``{key}``, set
#: by the caller), joined to the compiler's facts as the Instruction view is.
_ROWS = (
    "SELECT {key}, i.exec_id AS x, i.start_ns AS s, i.start_ns + i.dur_ns AS e, "
    "coalesce(CASE WHEN n.instruction_type = 'TRANSPOSE' THEN 0 ELSE n.tensor_elements END, 0) AS el, "
    "coalesce(CASE WHEN n.instruction_type = 'TRANSPOSE' THEN n.tensor_elements END, 0) AS tel, "
    "CASE WHEN i.engine = 'tensor' AND coalesce(n.instruction_type, '') <> 'TRANSPOSE' THEN i.flops ELSE 0 END "
    "AS mfl, CASE WHEN i.engine = 'tensor' THEN i.flops ELSE 0 END AS hfl, "
    f"{HBM_READ} AS hr, {HBM_WRITE} AS hw, "
    "CASE WHEN i.engine <> 'dma' THEN i.bytes_read ELSE 0 END AS sr, "
    "CASE WHEN i.engine <> 'dma' THEN i.bytes_written ELSE 0 END AS sw, "
    "CASE WHEN i.opcode = 'LDWEIGHTS' THEN i.bytes_read ELSE 0 END AS lw, i.dur_ns AS dur, 1 AS cnt, {ch}"
    + ", ".join(f"(i.engine = '{e}')::INT AS n_{e}" for e in COMPUTE_ENGINES) + " "
    "FROM " + _DMA_SOURCE.replace("WHERE i.engine = 'dma'", "LEFT JOIN main.ops AS o ON o.op_id = i.op_id ")
    + "{join} WHERE i.engine <> 'cpu' AND {where}")
#: Scalar / Vector instructions' channels (instruction_info.channels, schema 1.7.0); NULL on other engines.
_CHANNELS = ("CASE WHEN i.engine = 'scalar' THEN n.channels END AS chs, "
             "CASE WHEN i.engine = 'vector' THEN n.channels END AS chv, ")
_SUMS = ("el", "tel", "mfl", "hfl", "hr", "hw", "sr", "sw", "lw", "dur", "cnt", "chs", "chv") + tuple(
    f"n_{e}" for e in COMPUTE_ENGINES)


def rows(keys: str, where: str, join: str = "", channels: bool = True) -> str:
    """One row per device instruction (not on the CPU) matching ``where``, with the columns ``keys`` (expressions
    over ``i`` instructions, ``o`` ops, ``n`` instruction_info, named) and what a node adds up: ``x`` (exec_id),
    ``s``/``e`` (start, end), ``el``/``tel`` (elements, transpose elements), ``mfl``/``hfl`` (Tensor Engine
    FLOPs without / with transposes), ``hr``/``hw`` (HBM), ``sr``/``sw`` (SBUF), ``lw`` (LDWEIGHTS), ``dur``,
    ``cnt``, ``chs``/``chv`` (a Scalar / Vector instruction's channels, else NULL; with ``channels=False`` the
    rows do not read ``instruction_info.channels``, for a query over a profile recorded before it was) and
    ``n_<engine>``. Example: ``rows("i.op_id AS k", "TRUE")``."""
    ch = _CHANNELS if channels else "NULL::INTEGER AS chs, NULL::INTEGER AS chv, "
    return _ROWS.format(key=keys, where=where, join=join, ch=ch)


def nodes(key: str, where: str, join: str = "") -> str:
    """Per node ``k`` (``key``: an expression over ``i`` instructions, ``o`` ops, ``n`` instruction_info): its
    merged intervals as lists (``iv``, ``el``, ``tel``, ``hb``, ``hfu``, ``mfu``, ``mbu`` per interval), their
    span (``s``, ``e``), their total length ``active_ns``, and the totals over its instructions (:func:`rows`):
    ``dur`` (Σ durations), ``cnt``, ``hfl``/``mfl``, ``hr``/``hw``, ``sr``/``sw``, ``lw``, ``chs``/``chv`` (NULL
    when no Scalar / Vector instruction's channels are known). The one definition of a
    node's figures: FrameworkNode and HloInstruction read it; the operator table (:mod:`traces.q_operators`) adds
    up the same :func:`rows` with the same formulas (:data:`HFU_SQL`, :data:`MFU_SQL`)."""
    isl = islands(rows(f"{key} AS k", where, join), "k", _SUMS)
    bw = _meta("hbm_ddr_bandwidth")
    tot = ", ".join(f"sum({c})::BIGINT AS {c}" for c in _SUMS)
    eng = ", ".join(f"'[' || min(s) FILTER (WHERE n_{e} > 0) || ', ' || max(e) FILTER (WHERE n_{e} > 0) || ']' "
                    f"AS span_{e}" for e in COMPUTE_ENGINES)
    return f"""(SELECT k, min(s) AS s, max(e) AS e, sum(e - s)::BIGINT AS active_ns, {tot}, {eng},
        '[' || string_agg('[' || s || ', ' || e || ']', ', ' ORDER BY s) || ']' AS iv,
        list(el ORDER BY s) AS el_l, list(tel ORDER BY s) AS tel_l, list(hr + hw ORDER BY s) AS hb_l,
        '[' || string_agg(round(100.0 * hfl / nullif({_PEAK_PER_NS} * (e - s), 0), 3)::VARCHAR, ', ' ORDER BY s)
            || ']' AS hfu_l,
        '[' || string_agg(round(100.0 * mfl / nullif({_PEAK_PER_NS} * (e - s), 0), 3)::VARCHAR, ', ' ORDER BY s)
            || ']' AS mfu_l,
        '[' || string_agg(round(100.0 * (hr + hw) / nullif({bw} * (e - s), 0), 3)::VARCHAR, ', ' ORDER BY s)
            || ']' AS mbu_l
        FROM ({isl}) GROUP BY k)"""


def _csv(col: str) -> str:
    return f"'[' || array_to_string({col}, ', ') || ']'"


#: A node's utilisations over its merged intervals' time: the one formula (FrameworkNode, the operator table).
HFU_SQL = f"100.0 * h.hfl / nullif({_PEAK_PER_NS} * h.active_ns, 0)"
MFU_SQL = f"100.0 * h.mfl / nullif({_PEAK_PER_NS} * h.active_ns, 0)"
_UTIL = "Tensor Engine FLOPs over the peak of the merged intervals' time (Summary's formula, per node)"
_BYTES = "the sum of Instruction's over the node's instructions (HBM: the compiler's count; SBUF: engine rows')"

#: A hierarchy level's figures over its instructions (the real schema's per-stage columns), shared by
#: HloInstruction and the other stages' tables (traces.profile_rest).
STAGE_FIGURES = (
    F("start_ts", "int64", _NS, True, "Minimum start of its instructions.", "h.s"),
    F("end_ts", "int64", _NS, True, "Maximum end of its instructions.", "h.e"),
    F("time_intervals", "string", None, True, "Merged instruction intervals.", "h.iv"),
    F("element_count_per_interval", "int64[]", None, True, "Elements processed per interval.", "h.el_l",
      "Tensor Engine elements of non-transpose instructions"),
    F("transpose_element_count_per_interval", "int64[]", None, True, "Transpose elements per interval.",
      "h.tel_l"),
    F("hbm_transfer_size_per_interval", "int64[]", _B, True, "HBM bytes per interval.", "h.hb_l"),
    F("hbm_read_bytes", "int64", _B, True, "Bytes read from HBM.", "h.hr", _BYTES),
    F("hbm_write_bytes", "int64", _B, True, "Bytes written to HBM.", "h.hw", _BYTES),
    F("sbuf_read_bytes", "int64", _B, False, "Bytes read from SBUF.", "h.sr", _BYTES),
    F("sbuf_write_bytes", "int64", _B, False, "Bytes written to SBUF.", "h.sw", _BYTES),
    F("load_weight_bytes", "int64", _B, False, "Bytes loaded by LDWEIGHTS.", "h.lw"),
)

#: Σ channels of a node's Scalar / Vector instructions: 0 without any, NULL when none's channels are known.
_TOTAL_CHANNELS = "coalesce(h.{c}, CASE WHEN h.n_{e} = 0 THEN 0 END)"
_CHANNELS_WHY = ("Σ over its instructions (every execution) of instruction_info.channels: the partitions (engine "
                 "lanes) each one's access pattern covers; NULL where not recorded (a profile before schema 1.7.0)")

_MODULE = "nullif(o.module_path, '')"
#: Each op's module path and every prefix of it: the op belongs to all its enclosing modules.
_PREFIXES = ("JOIN (SELECT DISTINCT module_path, array_to_string(string_split(module_path, '.')[1:d], '.') AS node "
             "FROM main.ops, range(1, len(string_split(module_path, '.')) + 1) AS r(d) "
             "WHERE coalesce(module_path, '') <> '') AS pre ON pre.module_path = o.module_path")
_PARENT = "nullif(array_to_string(string_split(h.k, '.')[1:-2], '.'), '')"

FRAMEWORK_NODE = Table(
    "FrameworkNode", "Framework hierarchy nodes: each part of a framework (nn.Module) path, with its operators' "
    "rolled-up figures.",
    f"{nodes('pre.node', 'TRUE', _PREFIXES)} AS h LEFT JOIN (SELECT node, string_agg(DISTINCT child, ', ') AS "
    "children FROM (SELECT array_to_string(string_split(module_path, '.')[1:d - 1], '.') AS node, "
    "array_to_string(string_split(module_path, '.')[1:d], '.') AS child FROM main.ops, "
    "range(2, len(string_split(module_path, '.')) + 1) AS r(d) WHERE coalesce(module_path, '') <> '') GROUP BY node"
    ") AS c ON c.node = h.k LEFT JOIN (SELECT module_path, string_agg(op_id::VARCHAR, ', ') AS ids FROM main.ops "
    "GROUP BY module_path) AS m ON m.module_path = h.k",
    (
        F("node_name", "string", None, True, "Name of the node. Example: NeuronLlamaDecoderLayer.", "h.k",
          "the whole nn.Module path to the node (encoder.layer.0), so same-named parts stay apart"),
        F("children_names", "string", None, True, "Child node names. Example: [child1, child2].",
          "'[' || coalesce(c.children, '') || ']'", "their whole paths"),
        F("parent_name", "string", None, True, "Name of the parent node.", _PARENT, "NULL at a top-level module"),
        F("children_ids", "string", None, True, "Framework operator ids of the node.",
          "'[' || coalesce(m.ids, '') || ']'", "ops.op_id of the ops whose module is exactly this node"),
        F("start_ts", "int64", _NS, True, "Earliest start among the node's operations.", "h.s"),
        F("end_ts", "int64", _NS, True, "Latest end among the node's operations.", "h.e"),
        F("time_intervals", "string", None, True, "Merged instruction intervals: [[start, end], ...].", "h.iv"),
        F("element_count_per_interval", "string", None, False, "Elements processed per interval.",
          _csv("h.el_l"), "Tensor Engine elements of non-transpose instructions (instruction_info.tensor_elements)"),
        F("transpose_element_count_per_interval", "string", None, False, "Transpose elements per interval.",
          _csv("h.tel_l")),
        F("hbm_transfer_size_per_interval", "string", _B, False, "HBM bytes per interval.", _csv("h.hb_l")),
        F("hfu", "float", "percent", False, "Hardware FLOPs Utilization of the node.",
          HFU_SQL, _UTIL + ", transposes included"),
        F("mfu", "float", "percent", False, "Model FLOPs Utilization of the node.",
          MFU_SQL, _UTIL + ", transposes excluded"),
        F("hfu_per_interval", "string", None, False, "HFU per interval.", "h.hfu_l"),
        F("mfu_per_interval", "string", None, False, "MFU per interval.", "h.mfu_l"),
        F("mbu_per_interval", "string", None, False, "MBU per interval.", "h.mbu_l",
          "HBM bytes over one HBM stack's bandwidth × the interval (Summary.mbu_estimated_percent's formula)"),
        F("hbm_read_bytes", "int64", _B, False, "Bytes read from HBM.", "h.hr", _BYTES),
        F("hbm_write_bytes", "int64", _B, False, "Bytes written to HBM.", "h.hw", _BYTES),
        F("sbuf_read_bytes", "int64", _B, False, "Bytes read from SBUF.", "h.sr", _BYTES),
        F("sbuf_write_bytes", "int64", _B, False, "Bytes written to SBUF.", "h.sw", _BYTES),
    ) + tuple(F(f"{e}_engine_instruction_count", "int64", None, False, f"{e} engine instructions.", f"h.n_{e}")
              for e in ("tensor", "scalar", "sync", "gpsimd", "vector"))
    + tuple(F(f"total_time_{e}", "string", _NS, False, f"[min, max] timestamp of {e} instructions.", f"h.span_{e}")
            for e in ("tensor", "scalar", "sync", "gpsimd", "vector"))
    + (
        F("load_weight_bytes", "int64", _B, False, "Bytes loaded by LDWEIGHTS.", "h.lw"),
        F("total_channels_scalar", "int64", None, False, "Channels processed by Scalar instructions.",
          _TOTAL_CHANNELS.format(e="scalar", c="chs"), _CHANNELS_WHY),
        F("total_channels_vector", "int64", None, False, "Channels processed by Vector instructions.",
          _TOTAL_CHANNELS.format(e="vector", c="chv"), _CHANNELS_WHY),
    ),
)

HLO_INSTRUCTION = Table(
    "HloInstruction", "HLO-level instructions (ours: the graph's ATen ops) with their instructions' figures.",
    f"{nodes('i.op_id', 'i.op_id IS NOT NULL')} AS h LEFT JOIN main.ops AS o ON o.op_id = h.k",
    (
        F("id", "int64", None, True, "Unique identifier.", "h.k", "ops.op_id"),
        F("raw_bir_id", "int64", None, True, "BIR level id.", None, "no BIR stage (ops → ISA directly)"),
        F("raw_penguin_id", "int64", None, True, "Penguin level id.", None, "no Penguin stage"),
        F("raw_hlo_id", "int64", None, True, "HLO level id.", "h.k", "ours is ops.op_id (Instruction.raw_hlo_id)"),
        F("raw_framework_id", "int64", None, True, "Framework level id.", "h.k",
          "ours is ops.op_id (Instruction.raw_framework_id)"),
        F("hlo_name", "string", None, True, "HLO operation name. Example: dot.1.", "o.aten_op",
          "the ATen op (Instruction.hlo_name)"),
        F("modular_flow_invocation_idx", "int64", None, False, "Which call of the function.", None,
          "no modular flows"),
        *STAGE_FIGURES,
    ),
    extra=("o.module_path AS layer",),
)

_RANK = "dense_rank() OVER (ORDER BY {})::INTEGER"


def frame_id(stack: str) -> str:
    """SQL for the StackFrame id of a call stack ``stack`` (SQL: source ids, outermost first, comma-separated):
    a hash of the whole chain, so one line reached from two callers is two frames, as in a real call tree.
    Example: ``frame_id("'1,2'")``."""
    return f"((hash({stack}) >> 1)::BIGINT)::VARCHAR"


#: An op's call stack: ops.stack, or its one line when only that is known (eager and backward ops).
OP_STACK = "coalesce(o.stack, o.source_id::VARCHAR)"
#: Every frame: each distinct prefix of an op's call stack (depth ``d``), its line and its caller's prefix.
_FRAMES = (f"(SELECT DISTINCT array_to_string(p[1:d], ',') AS chain, "
           "CASE WHEN d > 1 THEN array_to_string(p[1:d - 1], ',') END AS up, p[d]::BIGINT AS source_id "
           f"FROM (SELECT string_split({OP_STACK}, ',') AS p FROM main.ops AS o WHERE o.source_id IS NOT NULL), "
           "range(1, len(p) + 1) AS r(d)) AS f "
           # ranked over every source line, as StackFrameFileLocation numbers them
           f"JOIN (SELECT source_id, {_RANK.format('source_id')} AS loc FROM main.sources) AS s USING (source_id)")

STACK_FRAME = Table(
    "StackFrame", "Stack frames tracing execution back to source code.", _FRAMES,
    (
        F("id", "string", None, True, "Stack frame id (Instruction.stack_frame_ids).", frame_id("f.chain"),
          "a hash of the call chain down to the frame (ops.stack)"),
        F("file_location_id", "int32", None, True, "StackFrameFileLocation.id.", "s.loc"),
        F("parent_frame_id", "string", None, True, "Parent frame id, or 0 at the root.",
          f"CASE WHEN f.up IS NULL THEN '0' ELSE {frame_id('f.up')} END",   # hash(NULL) is not NULL
          "the caller's frame: the user's frames only (torch, the standard library and neuron_stack are left "
          "out, as the profiler does); eager and backward ops have their line alone, a root"),
    ),
)
STACK_FRAME_FILE_LOCATION = Table(
    "StackFrameFileLocation", "File, function and line of each stack frame.", "main.sources AS s",
    (
        F("id", "string", None, True, "File location id.", _RANK.format("s.source_id") + "::VARCHAR"),
        F("file_name_id", "int32", None, True, "StackFrameFileName.id.", _RANK.format("s.file")),
        F("function_name_id", "int32", None, True, "StackFrameFunctionName.id.",
          _RANK.format("coalesce(s.function, '')")),
        F("line_number", "int32", None, True, "Line number within the file.", "s.line"),
    ),
)
STACK_FRAME_FILE_NAME = Table(
    "StackFrameFileName", "Source file names of the stack frames.", "(SELECT DISTINCT file FROM main.sources) AS s",
    (F("id", "string", None, True, "File name id.", _RANK.format("s.file") + "::VARCHAR"),
     F("name", "string", None, True, "Source file path.", "s.file")),
)
STACK_FRAME_FUNCTION_NAME = Table(
    "StackFrameFunctionName", "Function names of the stack frames.",
    "(SELECT DISTINCT coalesce(function, '') AS function FROM main.sources) AS s",
    (F("id", "string", None, True, "Function name id.", _RANK.format("s.function") + "::VARCHAR"),
     F("name", "string", None, True, "Function or method name.", "s.function")),
)

#: NKI instructions: their kernel line ``file.py:line`` (instructions.nki_source_location) and the op (kernel).
#: With ``iv``, its loop variables (instruction_info.operands' ``nki_iv``: [[variable, value, file, line], ...],
#: outermost first), where instruction_info has the instruction once.
_KERNEL = ("(SELECT DISTINCT i.queue, i.pc, coalesce(i.pcore, 0) AS pcore, x.graph_id, i.nki_source_location AS loc, "
           "regexp_extract(i.nki_source_location, '^(.*):(\\d+)$', 1) AS file, "
           "try_cast(regexp_extract(i.nki_source_location, '^(.*):(\\d+)$', 2) AS BIGINT) AS line, o.name AS fn, "
           "json_extract(n.operands, '$.nki_iv[*]') AS iv "
           "FROM main.instructions AS i JOIN main.executions AS x USING (exec_id) LEFT JOIN main.ops AS o "
           "USING (op_id) LEFT JOIN (SELECT graph_id, queue, pc, pcore, operands FROM main.instruction_info "
           "QUALIFY count(*) OVER (PARTITION BY graph_id, queue, pc, pcore) = 1) AS n ON n.graph_id = x.graph_id "
           "AND n.queue = i.queue AND n.pc = i.pc AND n.pcore = coalesce(i.pcore, 0) "
           "WHERE i.nki_source_location IS NOT NULL)")


def _iv_id(chain: str, pcore: str) -> str:
    """SQL for a KernelIterationVariables id: a hash of the loop entries down to it (``chain``) on ``pcore``."""
    return f"(hash({chain}, {pcore}) >> 1)::BIGINT"


_IV_WHY = "the loop variables of nl.affine_range / sequential_range / static_range, recorded per instruction " \
          "while the kernel unrolls (instruction_info.operands nki_iv)"
#: Every loop entry: each distinct prefix of an instruction's loop variables (depth ``d``).
_IVS = ("(SELECT DISTINCT pcore, array_to_string(l[1:d], ',') AS chain, "
        "CASE WHEN d > 1 THEN array_to_string(l[1:d - 1], ',') END AS up, l[d] AS e "
        "FROM (SELECT coalesce(pcore, 0) AS pcore, json_extract(operands, '$.nki_iv[*]') AS l "
        "FROM main.instruction_info WHERE operands LIKE '%nki_iv%'), range(1, len(l) + 1) AS r(d)) AS v")
_KFRAME = "(hash(k.file, k.fn) >> 1)::BIGINT"
_ONE_KFRAME = "one frame per kernel: the kernel's own lines are recorded, not its call stack"

KERNEL_INSTRUCTIONS = Table(
    "KernelInstructions", "NKI kernel instructions with their source line and call stack.", f"{_KERNEL} AS k",
    (
        F("kernel_instruction_name", "string", None, True, "Kernel instruction id.",
          "k.queue || '.' || k.pc || ':' || k.graph_id", "queue.pc:graph (the instruction's row in its graph)"),
        F("stack_frame_id", "int64", None, False, "KernelStackFrames.stack_frame_id.", _KFRAME, _ONE_KFRAME),
        F("stack_frame_depth", "int64", None, False, "Depth of the call stack.", "1", _ONE_KFRAME),
        F("iteration_variables_id", "int64", None, False, "KernelIterationVariables id.",
          "CASE WHEN len(k.iv) > 0 THEN " + _iv_id("array_to_string(k.iv, ',')", "k.pcore") + " END",
          "the innermost loop's entry; NULL outside loops"),
        F("iteration_variable_depth", "int64", None, False, "Loop nesting depth.", "coalesce(len(k.iv), 0)",
          _IV_WHY),
        F("pcore_idx", "int64", None, False, _PCORE, "k.pcore"),
        F("file_path", "string", None, False, "Source file of the instruction's code.", "k.file"),
        F("line_number", "int64", None, False, "Line of the instruction's code.", "k.line"),
    ),
)
KERNEL_STACK_FRAMES = Table(
    "KernelStackFrames", "Call stack frames of kernel instructions.",
    f"(SELECT DISTINCT file, fn, pcore, min(line) OVER (PARTITION BY file, fn) AS line FROM {_KERNEL}) AS k",
    (
        F("stack_frame_id", "int64", None, True, "Frame id.", _KFRAME),
        F("fully_qualified_function_name", "string", None, False, "The function.", "k.fn",
          "the kernel op's name (the kernel function)"),
        F("parent_stack_frame_id", "int64", None, False, "The caller's frame.", None, _ONE_KFRAME),
        F("pcore_idx", "int64", None, False, _PCORE, "k.pcore"),
        F("file_path", "string", None, False, "File defining the function.", "k.file"),
        F("line_number", "int64", None, False, "Line of the function.", "k.line",
          "the kernel's first recorded line (its definition line is not recorded)"),
    ),
)
KERNEL_ITERATION_VARIABLES = Table(
    "KernelIterationVariables", "Loop iteration variables of kernel instructions.", _IVS,
    (
        F("iteration_variable_id", "int64", None, True, "Iteration variable entry id.", _iv_id("v.chain", "v.pcore"),
          "a hash of the loop entries down to this one: " + _IV_WHY),
        F("variable_name", "string", None, False, "Name of the variable. Example: k.", "v.e->>0",
          "the for loop's target on the loop's line (_ when it is not a plain name)"),
        F("variable_value", "int64", None, False, "Its value at this iteration.", "(v.e->>1)::BIGINT"),
        F("parent_iteration_variable_id", "int64", None, False, "The outer loop's entry.",
          f"CASE WHEN v.up IS NOT NULL THEN {_iv_id('v.up', 'v.pcore')} END"),
        F("pcore_idx", "int64", None, False, _PCORE, "v.pcore"),
        F("file_path", "string", None, False, "File defining the variable.", "v.e->>2"),
        F("line_number", "int64", None, False, "Line defining the variable.", "(v.e->>3)::BIGINT"),
    ),
)

TABLES = (FRAMEWORK_NODE, HLO_INSTRUCTION, STACK_FRAME, STACK_FRAME_FILE_LOCATION, STACK_FRAME_FILE_NAME,
          STACK_FRAME_FUNCTION_NAME, KERNEL_INSTRUCTIONS, KERNEL_STACK_FRAMES, KERNEL_ITERATION_VARIABLES)
"""The hierarchy and source tables this module defines."""
