"""The rest of the real Neuron Explorer's device tables, defined over ours: ``OpcodeSummary``, ``ActiveTime``,
``DmaPacket``, ``DmaPacketAggregated``, ``DmaQueuesInfo``, ``PendingDma``, ``CoreBarriers``, ``FrameworkNode``,
``HloInstruction``, ``StackFrame*``, ``Kernel*``, ``SbufUsage``, ``PsumUsage``, ``Throttle`` and
``ThrottleSummary`` (SDK ``tools/neuron-explorer/profile-schema-reference.rst``, schema 7.4.0). Each is a view
(:mod:`traces.profile_schema` creates them in every profile); a field we cannot fill is a typed NULL whose
``why`` says so, and a table we have no rows for (``CoreBarriers``, ``KernelIterationVariables``) keeps its
real columns and no rows, never made-up ones.

>>> [f.name for f in ACTIVE_TIME.fields]
['start_ts', 'end_ts', 'engine', 'pcore_idx', 'duration_ns']
>>> "PARTITION BY k" in islands("SELECT 1 AS k, 0 AS s, 1 AS e", "k")
True
"""
from __future__ import annotations

from traces.real_fields import _B, _NS, _PCORE, F, Table
from traces.summary_sql import DEVICE_NS_SQL
from traces.vocab import COMPUTE_ENGINES


def islands(rows_sql: str, keys: str, sums: tuple[str, ...] = ()) -> str:
    """Merged intervals: ``rows_sql`` yields ``keys``, ``s``, ``e`` (and the ``sums`` columns); the result is one
    row per run of overlapping (or touching) intervals with the same keys: ``keys``, ``s``, ``e`` and each sum."""
    extra = "".join(f", sum({c})::BIGINT AS {c}" for c in sums)
    # Of identical intervals one starts a run (brk 1), the others not, in whatever order the first window sorted
    # them; the second window counts ties together (its default RANGE frame) so they all join that run. With
    # ROWS there, a second sort that put a tie with brk 0 first would join it to the run before, across the gap:
    # SQL promises no order among ties.
    return f"""SELECT {keys}, min(s) AS s, max(e) AS e{extra} FROM (
        SELECT *, sum(brk) OVER (PARTITION BY {keys} ORDER BY s, e) AS grp FROM (
            SELECT *, CASE WHEN s <= max(e) OVER (PARTITION BY {keys} ORDER BY s, e
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS brk FROM ({rows_sql})))
        GROUP BY {keys}, grp"""


def _meta(key: str, typ: str = "DOUBLE") -> str:
    return f"(SELECT try_cast(max(value) AS {typ}) FROM main.metadata WHERE key = '{key}')"


_COMPUTE = ", ".join(f"'{e}'" for e in COMPUTE_ENGINES)
#: The executions the summaries count (traces.summary_sql.measured_condition, with the profile's own choice).
_MEASURED = ("exec_id IN (SELECT exec_id FROM main.executions WHERE "
             "(SELECT max(value) FROM main.metadata WHERE key = 'summary_includes_warmup') = 'true' "
             "OR NOT coalesce(warmup, FALSE) OR NOT EXISTS "
             "(SELECT 1 FROM main.executions WHERE NOT coalesce(warmup, FALSE)))")
_PEAK_PER_NS = f"({_meta('tensor_engine_peak_bf16_flops')} / 1e9)"

OPCODE_SUMMARY = Table(
    "OpcodeSummary", "Summary of instruction counts and total execution time grouped by compute engine and opcode.",
    "main.opcode_summary AS o LEFT JOIN ("
    "SELECT engine, opcode, sum(e - s)::BIGINT AS active_ns FROM ("
    + islands(f"SELECT exec_id, engine, opcode, start_ns AS s, start_ns + dur_ns AS e FROM main.instructions "
              f"WHERE {_MEASURED}", "exec_id, engine, opcode")
    + ") GROUP BY ALL) AS a USING (engine, opcode) "
    f"CROSS JOIN (SELECT sum({DEVICE_NS_SQL}) AS device_ns FROM main.executions WHERE {_MEASURED}) AS t",
    (
        F("engine", "string", None, True, "Compute engine that executed the instructions. Example: tensor.",
          "o.engine"),
        F("opcode", "string", None, True, "Opcode of the instructions. Example: MATMUL.", "o.opcode"),
        F("instruction_count", "int64", None, True, "Instructions with this engine and opcode.",
          "o.instruction_count", "measured executions (warm-ups left out, as every summary)"),
        F("instruction_time_ns", "int64", _NS, True, "Total execution time of those instructions (overlaps added).",
          "o.instruction_time_ns"),
        F("active_time_ns", "int64", _NS, True,
          "Time when at least one instruction with this engine and opcode is executing (overlaps merged).",
          "coalesce(a.active_ns, 0)", "merged per execution, summed over executions"),
        F("active_time_percent", "float", None, True,
          "Percentage of total execution time when at least one such instruction is executing.",
          "100.0 * coalesce(a.active_ns, 0) / nullif(t.device_ns, 0)",
          "total execution time: Σ device time of the measured executions (Summary.total_time)"),
    ),
    extra=("o.flops AS flops", "o.transfer_bytes AS transfer_bytes"),
)

ACTIVE_TIME = Table(
    "ActiveTime", "A timeline of when engines are active: the merged intervals of all instructions on the engine.",
    "(" + islands(f"SELECT exec_id, core, coalesce(pcore, 0) AS pcore, engine, start_ns AS s, start_ns + dur_ns AS e "
                  f"FROM main.instructions WHERE engine IN ({_COMPUTE}) AND dur_ns > 0",
                  "exec_id, core, pcore, engine") + ") AS a",
    (
        F("start_ts", "int64", _NS, True, "Timestamp when activity on this engine starts.", "a.s"),
        F("end_ts", "int64", _NS, True, "Timestamp when activity on this engine ends.", "a.e"),
        F("engine", "string", None, True, "Compute engine of the active period. Example: tensor.", "a.engine",
          "the five compute engines; DMA queues and the host are not engines"),
        F("pcore_idx", "int64", None, True, _PCORE, "a.pcore"),
        F("duration_ns", "int64", _NS, True, "The duration of the active time period.", "a.e - a.s"),
    ),
    extra=("a.core AS nc_idx", "a.exec_id AS exec_id"),
)

#: DMA rows with the compiler's facts (their access patterns, their program index), as the Instruction view joins.
_DMA_SOURCE = (
    "main.instructions AS i LEFT JOIN main.executions AS x USING (exec_id) "
    "LEFT JOIN (SELECT * FROM main.instruction_info QUALIFY count(*) OVER (PARTITION BY graph_id, queue, pc, pcore) "
    "= 1) AS n ON n.graph_id = x.graph_id AND n.queue = i.queue AND n.pc = i.pc AND n.pcore = coalesce(i.pcore, 0) "
    "WHERE i.engine = 'dma'")
_DMA_ID = "(hash(i.exec_id, i.queue, i.pc, i.pcore) >> 1)::BIGINT"
_QUEUE_IDX = "try_cast(regexp_extract(i.queue, '(\\d+)$', 1) AS BIGINT)"
#: The real DmaQueueType of a queue: our IO queues carry the compiler's loads and stores (data), the spill queues
#: its spills, and the dynamic ones the DGE's (hardware) or GpSimd's (software) descriptors.
_QUEUE_TYPE = ("CASE WHEN i.queue ILIKE '%DynamicHW%' THEN 'hardware_dynamic' WHEN i.queue ILIKE '%Dynamic%' "
               "THEN 'software_dynamic' WHEN i.queue ILIKE 'q%' THEN 'data' ELSE 'unknown' END")
_OPERAND = "json_extract_string(n.operands, '$.{side}[0].{key}')"
_AP = "json_extract(n.operands, '$.{side}[0].ap')"
_ONE_PACKET = "one DMA instruction is one transfer here (not split into packets): one packet per aggregated DMA"
_NO_CRC = "data is not checksummed"


def _ap_list(side: str, pick: int) -> str:
    """``[counts]`` (pick 1) or ``[strides]`` (pick 0) of an operand's access pattern, as the real text."""
    return (f"'[' || array_to_string(list_transform(CAST({_AP.format(side=side)} AS BIGINT[][]), "
            f"lambda p: p[{pick + 1}]), ', ') || ']'")


def _partitions(side: str) -> str:
    ap = f"CAST({_AP.format(side=side)} AS BIGINT[][])"
    return (f"CASE WHEN {_OPERAND.format(side=side, key='m')} IN ('sbuf', 'psum') THEN "
            f"CAST({ap}[1][2] AS INTEGER) END")


DMA_PACKET = Table(
    "DmaPacket", "A DMA packet transfers data within a Neuron Device; it belongs to an aggregated DMA.",
    _DMA_SOURCE,
    (
        F("start_ts", "int64", _NS, True, "Timestamp when the packet started.", "i.start_ns"),
        F("end_ts", "int64", _NS, True, "Timestamp when the packet finished.", "i.start_ns + i.dur_ns"),
        F("duration_ns", "int64", _NS, True, "Duration of the packet.", "i.dur_ns"),
        F("pcore_idx", "int64", None, False, _PCORE, "coalesce(i.pcore, 0)"),
        F("id", "int64", None, True, "Unique identifier for this DMA packet.", _DMA_ID, _ONE_PACKET),
        F("packet_idx", "int32", None, True, "Index of the packet within its transfer.", "0", _ONE_PACKET),
        F("packet_aggregation_id", "int64", None, True, "The DmaPacketAggregated row of this packet.", _DMA_ID,
          _ONE_PACKET),
        F("engine_idx", "int64", None, False, "Index of the DMA engine that executed this packet.", _QUEUE_IDX,
          "each IO queue is served by its own DMA engine here (16 engines, 16 queues)"),
        F("read_bytes", "int64", _B, True, "Bytes read.", "i.bytes_read"),
        F("write_bytes", "int64", _B, True, "Bytes written.", "i.bytes_written"),
        F("transfer_bytes", "int64", _B, True, "Bytes transferred.", "greatest(i.bytes_read, i.bytes_written)"),
        F("throughput", "float", "bytes_per_second", True, "transfer_bytes / duration.",
          "greatest(i.bytes_read, i.bytes_written) * 1e9 / nullif(i.dur_ns, 0)"),
        F("queue_type", "string", None, True, "DmaQueueType of the packet's queue.", _QUEUE_TYPE,
          "from the queue name: IO queues carry the compiler's loads and stores (data)"),
        F("variable", "string", None, False, "Variable or tensor name transferred.",
          f"coalesce({_OPERAND.format(side='src', key='b')}, {_OPERAND.format(side='dst', key='b')})",
          "the HBM tensor or on-chip buffer the compiler names (source side first)"),
        F("queue_name", "string", None, False, "Queue name. Example: qSyncIO0.", "i.queue"),
        F("queue_idx", "int64", None, False, "Queue index.", _QUEUE_IDX),
        F("crc", "int64", None, True, "Cyclic Redundancy Check value.", None, _NO_CRC),
    ),
    extra=("i.core AS nc_idx", "i.exec_id AS exec_id"),
)

DMA_PACKET_AGGREGATED = Table(
    "DmaPacketAggregated", "An aggregation of DMA packets which together fulfil a transfer of one or more tensors.",
    _DMA_SOURCE,
    (
        F("start_ts", "int64", _NS, True, "First start of the packets.", "i.start_ns"),
        F("end_ts", "int64", _NS, True, "Last end of the packets.", "i.start_ns + i.dur_ns"),
        F("duration_ns", "int64", _NS, True, "Duration of the aggregated DMA.", "i.dur_ns"),
        F("id", "int64", None, True, "Unique identifier (DmaPacket.packet_aggregation_id).", _DMA_ID),
        F("pcore_idx", "int64", None, False, _PCORE, "coalesce(i.pcore, 0)"),
        F("block_id", "int32", None, True, "The compiler's id of the transfer.", "n.seq",
          "the compiler's instruction index (Instruction.bir_id)"),
        F("queue_idx", "int64", None, True, "Queue index.", _QUEUE_IDX),
        F("queue_name", "string", None, True, "Queue name. Example: qSyncIO0.", "i.queue"),
        F("queue_type", "string", None, False, "DmaQueueType of the queue.", _QUEUE_TYPE, "from the queue name"),
        F("op", "string", None, True, "DMA operation type. Example: read.",
          f"CASE WHEN {_OPERAND.format(side='src', key='m')} = 'hbm' THEN 'read' "
          f"WHEN {_OPERAND.format(side='dst', key='m')} = 'hbm' THEN 'write' ELSE 'copy' END",
          "read from HBM, write to HBM, else an on-chip copy"),
        F("variable", "string", None, True, "Variable or tensor name transferred.",
          f"coalesce({_OPERAND.format(side='src', key='b')}, {_OPERAND.format(side='dst', key='b')})"),
        F("read_bytes", "int64", _B, True, "Bytes read.", "i.bytes_read"),
        F("write_bytes", "int64", _B, True, "Bytes written.", "i.bytes_written"),
        F("transfer_bytes", "int64", _B, True, "Bytes transferred.", "greatest(i.bytes_read, i.bytes_written)"),
        F("throughput", "float", "bytes_per_second", True, "transfer_bytes / duration.",
          "greatest(i.bytes_read, i.bytes_written) * 1e9 / nullif(i.dur_ns, 0)"),
        F("source", "string", None, True, "Source memory. Example: [SB].",
          f"'[' || upper({_OPERAND.format(side='src', key='m')}) || ']'", "HBM, SBUF or PSUM"),
        F("dest", "string", None, True, "Destination memory. Example: [OUTPUT].",
          f"'[' || upper({_OPERAND.format(side='dst', key='m')}) || ']'", "HBM, SBUF or PSUM"),
        F("semaphore_id", "string", None, True, "Semaphore used for synchronisation.", None,
          "ours are per queue pair: SemaphoreUpdate.id"),
        F("modular_flow_function", "string", None, False, "Modular flow function.", None, "no modular flows"),
        F("read_sbuf_partitions", "string", None, True, "SBUF partitions read. Example: 0,1.", None,
          "the count is in read_num_sbuf_partitions"),
        F("read_num_sbuf_partitions", "int32", None, True, "Number of SBUF partitions read.", _partitions("src"),
          "the access pattern's partition count (SBUF or PSUM sources)"),
        F("read_shape", "string", None, True, "Shape read. Example: [1024, 512].", _ap_list("src", 1),
          "the source access pattern's counts"),
        F("read_offset", "string", None, True, "Byte offset in the source.",
          f"'[' || {_OPERAND.format(side='src', key='o')} || ']'"),
        F("read_steps", "string", None, True, "Stride of reads.", _ap_list("src", 0),
          "the source access pattern's strides (elements)"),
        F("write_sbuf_partitions", "string", None, True, "SBUF partitions written. Example: 0-15.", None,
          "the count is in write_num_sbuf_partitions"),
        F("write_num_sbuf_partitions", "int32", None, True, "Number of SBUF partitions written.",
          _partitions("dst"), "the access pattern's partition count (SBUF or PSUM destinations)"),
        F("write_shape", "string", None, True, "Shape written.", _ap_list("dst", 1),
          "the destination access pattern's counts"),
        F("write_offset", "string", None, True, "Byte offset in the destination.",
          f"'[' || {_OPERAND.format(side='dst', key='o')} || ']'"),
        F("write_steps", "string", None, True, "The destination stride.", _ap_list("dst", 0),
          "the destination access pattern's strides (elements)"),
        F("is_transpose_mode", "bool", None, False, "Transpose mode.", "FALSE", "no DMA transposes are lowered"),
        F("transpose_element_size", "string", None, False, "Transpose element size.", None, "no DMA transposes"),
        F("transpose_shape", "string", None, False, "Transpose shape.", None, "no DMA transposes"),
        F("transpose_from_shape", "string", None, False, "Transpose source shape.", None, "no DMA transposes"),
        F("transpose_to_shape", "string", None, False, "Transpose target shape.", None, "no DMA transposes"),
        F("transpose_unroll_factor", "string", None, False, "Transpose unroll factor.", None, "no DMA transposes"),
        F("trigger", "int64", None, False, "Start of the instruction that triggered this DMA.", None,
          "no compute instruction triggers a DMA here (Instruction.dma_trigger_start_ts)"),
        F("completion", "int64", None, False, "End of the instruction that triggered this DMA.", None,
          "as trigger"),
    ),
    extra=("i.core AS nc_idx", "i.exec_id AS exec_id"),
)

DMA_QUEUES_INFO = Table(
    "DmaQueuesInfo", "Information about DMA queues (each DMA engine has 16 queues).",
    "(SELECT DISTINCT queue, coalesce(pcore, 0) AS pcore FROM main.instructions WHERE engine = 'dma') AS i",
    (
        F("name", "string", None, True, "The name of the DMA queue. Example: qSyncIO0.", "i.queue"),
        F("type", "string", None, True, "The type of DMA queue.", _QUEUE_TYPE, "DmaQueueType from the name"),
        F("pcore_idx", "int64", None, True, _PCORE, "i.pcore"),
        F("idx", "int64", None, True, "Index of the queue within its DMA engine.", _QUEUE_IDX),
        F("engine_idx", "int64", None, True, "Index of the queue's DMA engine.", _QUEUE_IDX,
          "each IO queue is served by its own DMA engine here"),
        F("axi_port", "int64", None, True, "The AXI port used.", None, "the AXI fabric is not modelled"),
        F("dram_channel", "int64", None, True, "The DRAM channel used.", None, "HBM is one pool of bandwidth here"),
    ),
)

PENDING_DMA = Table(
    "PendingDma", "Outstanding DMA operations that are queued.",
    "(SELECT exec_id, core, pcore, t, sum(d) OVER (PARTITION BY exec_id, core, pcore ORDER BY t, d "
    "ROWS UNBOUNDED PRECEDING) AS n FROM ("
    "SELECT exec_id, core, coalesce(pcore, 0) AS pcore, start_ns - coalesce(sem_wait_ns, 0) AS t, 1 AS d "
    "FROM main.instructions WHERE engine = 'dma' UNION ALL "
    "SELECT exec_id, core, coalesce(pcore, 0), start_ns + dur_ns, -1 FROM main.instructions WHERE engine = 'dma')"
    ") AS p",
    (
        F("timestamp", "int64", _NS, True, "Time of the measurement.", "p.t",
          "one sample at each DMA's queueing and completion"),
        F("value", "int32", None, True, "Number of pending DMA operations queued.", "p.n",
          "DMAs queued (from the end of their semaphore wait) and not yet complete"),
        F("pcore_idx", "int64", None, False, _PCORE, "p.pcore"),
    ),
    extra=("p.core AS nc_idx", "p.exec_id AS exec_id"),
)

CORE_BARRIERS = Table(
    "CoreBarriers", "Core barriers synchronising one engine across the physical cores of a Logical NeuronCore.",
    "main.instructions AS i WHERE i.opcode = 'PSEUDO_CORE_BARRIER'",
    tuple(F(n, t, u, r, d, o, "the LNC=2 schedule synchronises its two cores' engines through semaphores "
                                "(SemaphoreUpdate), not barrier instructions: no rows")
          for n, t, u, r, d, o in (
        ("start_ts", "int64", _NS, True, "Start of the barrier.", "i.start_ns"),
        ("end_ts", "int64", _NS, True, "End of the barrier.", "i.start_ns + i.dur_ns"),
        ("duration_ns", "int64", _NS, True, "Duration of the barrier.", "i.dur_ns"),
        ("engine_name", "string", None, True, "The engine synchronised. Example: GpSimd.", "i.queue"),
        ("id", "int64", None, True, "Unique identifier.", _DMA_ID),
        ("semaphore", "int64", None, True, "Semaphore implementing the barrier.", None),
        ("compiler_pc", "int64", None, True, "Compiler program counter.", "i.pc"),
        ("compiler_opcode", "string", None, True, "Opcode at compile time.", "i.opcode"),
        ("compiler_operands", "string", None, True, "Operands at compile time.", None),
        ("pcore_idx", "int64", None, False, _PCORE, "coalesce(i.pcore, 0)"))),
)


def _usage(memory: str, columns: tuple[tuple[str, str, str], ...]) -> str:
    """Occupancy over time of the ``memory`` allocations (SbufAllocation): one sample per (execution, core, time)
    an allocation starts or ends; each column ``(name, share of an allocation it counts, capacity)`` is
    100 × the bytes allocated there / the capacity."""
    deltas = ", ".join(f"sum(sgn * size * ({share})) AS d_{name}" for name, share, _ in columns)
    running = ", ".join(f"100.0 * sum(d_{name}) OVER w / nullif({cap}, 0) AS {name}" for name, _, cap in columns)
    alloc = (f"SELECT *, end_address - start_address + 1 AS size FROM main.\"SbufAllocation\" "
             f"WHERE memory = '{memory}'")
    return (f"(SELECT exec_id, core, t, {running} FROM (SELECT exec_id, core, t, {deltas} FROM ("
            f"SELECT *, start_ts AS t, 1 AS sgn FROM ({alloc}) UNION ALL BY NAME "
            f"SELECT *, end_ts AS t, -1 AS sgn FROM ({alloc})) GROUP BY exec_id, core, t) "
            f"WINDOW w AS (PARTITION BY exec_id, core ORDER BY t ROWS UNBOUNDED PRECEDING)) AS u")


_PARTS = _meta("tensor_engine_num_rows")
_SB_PART = _meta("sbuf_bytes_per_partition")
_PS_PART = _meta("psum_bytes_per_partition")
_PS_BANK = f"({_PS_PART} / {_meta('psum_banks')})"
_ON_PART = "(partition <= {p} AND {p} < partition + partition_count)::INT"
_ON_BANK = f"(start_address // {_PS_BANK} = {{b}})::INT * partition_count"
_USAGE_WHY = "allocations are per logical core; NULL: the real tool samples each physical core"
_SAMPLES = "one sample whenever an allocation starts or ends (SbufAllocation), per execution and core"

SBUF_USAGE = Table(
    "SbufUsage", "State Buffer (SB) memory partition utilization metrics during execution.",
    _usage("SBUF", (("avg", "partition_count", f"{_PARTS} * {_SB_PART}"),)
           + tuple((f"p{p}", _ON_PART.format(p=p), _SB_PART) for p in (0, 32, 64, 96))),
    (F("timestamp", "int64", _NS, True, "Timestamp for this usage measurement.", "u.t", _SAMPLES),
     F("avg_util_percent", "float", "percent", False, "Average utilization across all partitions.", "u.avg",
       "bytes allocated over all partitions / (partitions × sbuf_bytes_per_partition)"))
    + tuple(F(f"partition_{p}_util_percent", "float", "percent", False, f"Fullness of partition {p}.", f"u.p{p}",
              "bytes allocated on the partition / sbuf_bytes_per_partition")
            for p in (0, 32, 64, 96))
    + (F("pcore_idx", "int64", None, False, _PCORE, None, _USAGE_WHY),),
    extra=("u.core AS nc_idx", "u.exec_id AS exec_id"),
)

PSUM_USAGE = Table(
    "PsumUsage", "PSUM memory bank utilization metrics during execution.",
    _usage("PSUM", (("avg", "partition_count", f"{_PARTS} * {_PS_PART}"),)
           + tuple((f"b{b}", _ON_BANK.format(b=b), f"{_PARTS} * {_PS_BANK}") for b in range(8))),
    (F("timestamp", "int64", _NS, True, "Timestamp for this usage measurement.", "u.t", _SAMPLES),
     F("avg_util_percent", "float", "percent", False, "Average fullness across all banks.", "u.avg",
       "bytes allocated / (partitions × psum_bytes_per_partition)"))
    + tuple(F(f"bank_{b}_util_percent", "float", "percent", False, f"Fullness of PSUM bank {b}.", f"u.b{b}",
              "bytes allocated in the bank (by start address) over all partitions / (partitions × bank size)")
            for b in range(8))
    + (F("pcore_idx", "int64", None, False, _PCORE, None, _USAGE_WHY),),
    extra=("u.core AS nc_idx", "u.exec_id AS exec_id"),
)

_RAMP = _meta("tensor_engine_throttle_ramp_ns")
#: The cost model's Tensor Engine limiter (device/cost.throttle_factor, trn2): after idling longer than the ramp,
#: a Tensor instruction starts at 50% of the PE array's rate, rising linearly to 100% over the ramp.
_THROTTLES = (
    f"(SELECT exec_id, core, pcore, s AS t, least({_RAMP}, device_end - s)::BIGINT AS dur FROM ("
    "SELECT i.exec_id, i.core, coalesce(i.pcore, 0) AS pcore, i.start_ns AS s, "
    "x.start_ns + coalesce(x.device_ns, x.end_ns - x.start_ns) AS device_end, "
    "lag(i.start_ns + i.dur_ns) OVER (PARTITION BY i.exec_id, i.core, coalesce(i.pcore, 0) ORDER BY i.start_ns) "
    "AS prev FROM main.instructions AS i JOIN main.executions AS x USING (exec_id) WHERE i.engine = 'tensor') "
    f"WHERE coalesce({_RAMP}, 0) > 0 AND (prev IS NULL OR s - prev > {_RAMP}))")
_THROTTLE_TYPE = "'tensor_engine_ramp'"

THROTTLE = Table(
    "Throttle", "Hardware throttling events on NeuronCores.", f"{_THROTTLES} AS h",
    (
        F("duration", "int64", _NS, True, "Duration of the throttling event.", "h.dur",
          "the ramp (metadata tensor_engine_throttle_ramp_ns), cut at the execution's end"),
        F("k", "int32", None, True, "Allowed utilization level (limit = k/n).", "1",
          "the ramp starts at 1/2 and rises linearly to 1 (device/cost.throttle_factor)"),
        F("n", "int32", None, True, "Maximum utilization level.", "2", "as k"),
        F("timestamp", "int64", _NS, True, "When the throttling started.", "h.t",
          "a Tensor instruction after an idle gap longer than the ramp (or the execution's first)"),
        F("type", "string", None, True, "Type of throttling. Example: activity_0.", _THROTTLE_TYPE,
          "ours: the Tensor Engine's power limiter of the trn2 cost model; no rows on targets without it"),
        F("pcore_idx", "int64", None, False, _PCORE, "h.pcore"),
    ),
    extra=("h.core AS nc_idx", "h.exec_id AS exec_id"),
)

THROTTLE_SUMMARY = Table(
    "ThrottleSummary", "Summary statistics for hardware throttling on each NeuronCore and type of throttling.",
    f"(SELECT x.core, sum({DEVICE_NS_SQL}) AS device_ns FROM main.executions AS x WHERE {_MEASURED} "
    f"GROUP BY x.core) AS c CROSS JOIN (VALUES ('all'), ({_THROTTLE_TYPE})) AS ty(type) LEFT JOIN ("
    f"SELECT core, sum(dur) AS ns, sum(dur * (0.5 + 0.25 * dur / {_RAMP})) AS w FROM {_THROTTLES} "
    f"WHERE {_MEASURED} GROUP BY core) AS h USING (core)",
    (
        F("nc_idx", "int32", None, True, "Index of the NeuronCore.", "c.core"),
        F("throttle_type", "string", None, False, "Type of throttling, or all.", "ty.type"),
        F("throttle_active_time_ns", "int64", _NS, False, "Time when throttling was active.",
          "coalesce(h.ns, 0)", "measured executions"),
        F("throttle_active_time_percent", "float", "percent", False, "Percent of time throttled.",
          f"100.0 * coalesce(h.ns, 0) / nullif(c.device_ns * greatest(1, {_meta('num_physical_cores')}), 0)",
          "of the core's device time (total_time) on each of its physical cores' PE arrays"),
        F("max_achievable_util_with_throttling_percent", "float", "percent", False,
          "Time-weighted average of the maximum achievable utilization during throttling.",
          "100.0 * h.w / nullif(h.ns, 0)",
          "the limit rises linearly from 50% to 100% over the ramp (75% on average over a whole one)"),
    ),
)

TABLES = (OPCODE_SUMMARY, ACTIVE_TIME, DMA_PACKET, DMA_PACKET_AGGREGATED, DMA_QUEUES_INFO, PENDING_DMA,
          CORE_BARRIERS, SBUF_USAGE, PSUM_USAGE, THROTTLE, THROTTLE_SUMMARY)
"""The device tables this module defines, in the real reference's order of kinds."""
