"""Dynamic shapes: a recompile for every new sequence length, and bucketing as the cure.

A BERT-style encoder is compiled with torch.compile(backend="neuron") and fed batches whose
sequence length changes every step. Neuron compiles static shapes, so each new length is a new
graph: a recompile, recorded with its reason (which input, which dimension, old -> new) and the
source line that made the call. With --bucket the inputs are padded up to a few bucket lengths
(with an attention mask), so only one graph per bucket is compiled and the recompile count drops;
the padded positions are ignored and the real positions match eager PyTorch.
"""
import time

import torch
from common import check, explain, finish, parser
from models import BertEncoder

from neuron_stack.dynamo import compile_events


def bucket_of(n: int, buckets: list[int]) -> int:
    return next(b for b in buckets if b >= n)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--bucket", action="store_true", help="pad sequence lengths up to a few buckets")
    p.add_argument("--serve", type=float, default=0, metavar="SECONDS",
                   help="after the compiles, keep serving the same lengths for SECONDS (for neuron-top/monitor)")
    args = p.parse_args()
    explain(__doc__)
    torch.manual_seed(0)
    cfg = dict(vocab=100, hidden=32, layers=1, heads=2, seq=32) if args.small else \
        dict(vocab=1000, hidden=128, layers=2, heads=4, seq=128)
    lengths = [5, 9, 12, 20, 7] if args.small else [17, 33, 48, 64, 90, 100, 128, 21]
    buckets = [16, 32] if args.small else [32, 64, 128]
    model = BertEncoder(**cfg).eval()
    compiled = torch.compile(model, backend="neuron")
    ok = True
    with torch.no_grad():
        batches = []
        for t in lengths:
            ids = torch.randint(0, cfg["vocab"], (2, t))
            mask = torch.ones(2, t, dtype=torch.long)
            if args.bucket:
                b = bucket_of(t, buckets)
                ids_in = torch.nn.functional.pad(ids, (0, b - t))
                mask_in = torch.nn.functional.pad(mask, (0, b - t))
            else:
                ids_in, mask_in = ids, mask
            out = compiled(ids_in, mask_in)[:, :t]
            ok &= check(f"seq {t:3d} (ran as {ids_in.shape[1]})", out, model(ids, mask), args.auto_cast)
            batches.append((ids_in, mask_in))
        # Serving the lengths already seen compiles nothing more: every call runs a cached graph.
        end = time.monotonic() + args.serve
        while time.monotonic() < end:
            for ids_in, mask_in in batches:
                compiled(ids_in, mask_in)
    events = compile_events()
    recompiles = [e for e in events if e["recompile"]]
    print(f"\n{len(events)} graphs compiled, {len(recompiles)} recompiles "
          f"({'bucketed to ' + str(buckets) if args.bucket else 'one per sequence length'})")
    for e in recompiles:
        src = e["source"]
        print(f"  recompile {e['name']}: {e['reason']} at {src.file.rsplit('/', 1)[-1]}:{src.line}" if src else
              f"  recompile {e['name']}: {e['reason']}")
    finish(ok)


if __name__ == "__main__":
    main()
