"""The web console's worker process (``python -m traces.console_worker PROFILE BYTES``), started by
:class:`traces.console.ConsoleWorker`: one read-only, bounded connection to one profile, in a process
whose address space is capped. Requests are JSON lines on stdin; each answer is a JSON line, then the
result as an Arrow IPC stream of the announced size. Its own module so that ``traces.console`` does not
import the query layer that imports it.
"""
from __future__ import annotations

import json
import sys

import pyarrow as pa

from traces.console import RefusedQuery, cap_address_space, run_user_sql
from traces.errors import OutOfMemory, TraceError


def main(path: str, memory_bytes: int) -> int:
    """Open the profile bounded, cap the address space, answer one request per line (until stdin closes)."""
    import pyarrow.ipc as ipc

    from traces.opening import open_profile

    out = sys.stdout.buffer

    def send(head: dict, body: bytes = b"") -> None:
        out.write(json.dumps(head).encode() + b"\n" + body)
        out.flush()

    try:
        profile = open_profile(path, external_access=False, bounded=True)
    except TraceError as exc:
        send({"error": str(exc)})
        return 1
    cap_address_space(memory_bytes)
    send({"ready": True})
    for line in sys.stdin.buffer:
        req = json.loads(line)
        try:
            res = run_user_sql(profile, req["sql"], select_only=True, max_rows=req["max_rows"],
                               timeout_s=req["timeout_s"], max_bytes=req["max_bytes"])
            sink = pa.BufferOutputStream()
            with ipc.new_stream(sink, res.table.schema) as writer:
                writer.write_table(res.table)
            body = sink.getvalue().to_pybytes()
            send({"size": len(body), "truncated": res.truncated}, body)
        except RefusedQuery as exc:
            send({"error": str(exc), "refused": True})
        except OutOfMemory as exc:
            send({"error": str(exc), "out_of_memory": True})
        except TraceError as exc:
            send({"error": str(exc)})
        except MemoryError:
            send({"error": f"query stopped: it needed more than the console's {memory_bytes >> 20} MiB of memory; "
                           "narrow it (a WHERE on start_ns, fewer or shorter columns)", "out_of_memory": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
