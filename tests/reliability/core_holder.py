"""One racer of the core-reservation battery: reserve, hold, release, forever (until killed).

Each holding is logged as ``core pid t_acquired t_released`` (CLOCK_MONOTONIC ns, one O_APPEND
write per line); while it holds, ``claims/<pid>`` names its cores and its acquire time, so a
parent that SIGKILLs it knows what it held. The recorded interval is always inside the real one
(stamped after acquire returns and before release starts), so an overlap between two holders
in the log is a real double reservation.

    python tests/reliability/core_holder.py WORKDIR SEED
"""
import json
import os
import random
import sys
import time
from pathlib import Path

from neuron_stack.runtime.cores import CoreAllocationError, acquire


def main() -> None:
    work, seed = Path(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    claims = work / "claims"
    log = os.open(work / "intervals.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    me = os.getpid()
    while True:
        try:
            if rng.random() < 0.7:   # overlapping explicit sets, as NEURON_RT_VISIBLE_CORES pins them
                lease = acquire("trn1", cores=sorted(rng.sample(range(8), rng.randint(1, 3))))
            else:                    # "any N cores", lowest first: everyone fights over 0, 1, 2...
                lease = acquire("trn1", rng.randint(1, 3))
        except CoreAllocationError:
            time.sleep(rng.uniform(0, 0.003))
            continue
        t0 = time.monotonic_ns()
        tmp = claims / f".{me}.tmp"
        tmp.write_text(json.dumps({"pid": me, "cores": lease.cores, "t0": t0}))
        os.replace(tmp, claims / str(me))
        time.sleep(rng.uniform(0, 0.01))
        t1 = time.monotonic_ns()
        os.write(log, "".join(f"{c} {me} {t0} {t1}\n" for c in lease.cores).encode())
        (claims / str(me)).unlink()
        lease.release()


if __name__ == "__main__":
    main()
