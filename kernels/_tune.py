# temporary tuning sweep (not part of the deliverable)
import itertools, json, sys, torch, triton, triton.testing
import kernels.decode_attention as da, kernels.prefill_attention as pa
from kernels.bench import paged_kv, PREFILL_CASES, causal_flops, NUM_HEADS, HEAD_DIM, DTYPE
dev = "cuda"; scale = HEAD_DIM ** -0.5; res = {}
def t(fn): return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
for batch, ctx in [(1, 4096), (64, 1024), (64, 4096), (256, 4096)]:
    kc, vc, bt, lens = paged_kv([ctx] * batch, dev)
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    moved = 2 * batch * ctx * 8 * 128 * 2
    for bn, w, st in itertools.product((16, 32, 64, 128), (2, 4, 8), (1, 2, 3)):
        da._launch_config = lambda device, bn=bn, w=w, st=st: dict(BLOCK_N=bn, num_warps=w, num_stages=st)
        try: ms = t(lambda: da.paged_decode_attention(q, kc, vc, bt, lens, scale))
        except Exception as e: ms = float("nan")
        res[f"dec b{batch} c{ctx} bn{bn} w{w} s{st}"] = (ms, moved / ms / 1e6)
    del kc, vc
    best = sorted((v[0], k) for k, v in res.items() if k.startswith(f"dec b{batch} c{ctx} "))[:5]
    print(batch, ctx, best, flush=True)
for name, (ql, sl) in PREFILL_CASES.items():
    kc, vc, bt, lens = paged_kv(sl, dev)
    q = torch.randn(sum(ql), NUM_HEADS, HEAD_DIM, device=dev, dtype=DTYPE)
    qsl = torch.tensor([0] + ql, device=dev).cumsum(0).to(torch.int32)
    for bm, bn, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (1, 2, 3)):
        pa._launch_config = lambda device, hd, bm=bm, bn=bn, w=w, st=st: dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
        try: ms = t(lambda: pa.paged_prefill_attention(q, kc, vc, bt, qsl, lens, scale))
        except Exception as e: ms = float("nan")
        res[f"pre {name} bm{bm} bn{bn} w{w} s{st}"] = (ms, causal_flops(ql, sl) / ms / 1e9)
    best = sorted((v[0], k, round(v[1])) for k, v in res.items() if k.startswith(f"pre {name} "))[:5]
    print(name, best, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
