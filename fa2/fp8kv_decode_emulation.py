# The lane-by-lane numpy emulation of fa2/fp8-kv.diff's fp8kv_decode_kernel
# (one CTA: every warp and lane, the swizzled staging, the permuted head-dim order, the
# m16n8k16 fragment layouts of the PTX ISA, bit-exact e4m3 decode, the cross-warp combine
# through its padded fragment-order rows, the splits cut from the launch's longest sequence,
# the last split's merge of all of them), against a float64 reference attention. Written by
# us. Run: python3 THIS [SEED]; prints the worst relative error (float64 rounding, ~1e-15,
# when the index logic is right).
import numpy as np, math, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # a quiet end under `| head`
if len(sys.argv) > 2 or (len(sys.argv) == 2 and not sys.argv[1].isdigit()):
    print(f"usage: {sys.argv[0]} [SEED] (a non-negative integer; got {' '.join(sys.argv[1:])!r})", file=sys.stderr)
    sys.exit(2)
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)

def e4m3_decode(b):
    s = -1.0 if b & 0x80 else 1.0; e = (b >> 3) & 0xF; m = b & 7
    if e == 0: return s * m / 8 * 2.0 ** -6
    return s * (1 + m / 8) * 2.0 ** (e - 7)
DEC = np.array([e4m3_decode(b) for b in range(256)])
def byte_perm(x, y, sel):
    src = [(x >> (8*i)) & 0xFF for i in range(4)] + [(y >> (8*i)) & 0xFF for i in range(4)]
    r = 0
    for i in range(4): r |= src[(sel >> (4*i)) & 7] << (8*i)
    return r
def pair(t):  # e4m3pair_to: (low = byte1 value, high = byte3 value)
    return (DEC[(t >> 8) & 0xFF], DEC[(t >> 24) & 0xFF])
def words(bs):  # bytes -> little-endian u32 list
    return [int(bs[4*i]) | int(bs[4*i+1]) << 8 | int(bs[4*i+2]) << 16 | int(bs[4*i+3]) << 24 for i in range(len(bs)//4)]

def mma(Dl, Al, B0l, B1l):
    # Dl[lane] = [4 floats]; Al[lane] = 4 regs each a (lo, hi) pair; B0l/B1l[lane] = (lo, hi)
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, c = lane // 4, lane % 4
        a = Al[lane]
        A[g, 2*c:2*c+2] = a[0]; A[g+8, 2*c:2*c+2] = a[1]; A[g, 2*c+8:2*c+10] = a[2]; A[g+8, 2*c+8:2*c+10] = a[3]
        B[2*c:2*c+2, g] = B0l[lane]; B[2*c+8:2*c+10, g] = B1l[lane]
    D = A @ B
    for lane in range(32):
        g, c = lane // 4, lane % 4
        Dl[lane][0] += D[g, 2*c]; Dl[lane][1] += D[g, 2*c+1]; Dl[lane][2] += D[g+8, 2*c]; Dl[lane][3] += D[g+8, 2*c+1]

def split_range(seqlen_k, max_seqlen_k, num_splits, split):
    # The kernel's cut: from the launch's longest sequence, else (longer, a caller's mistake)
    # from the sequence's own length. Blocks [n_min, n_max).
    n_blocks = (seqlen_k + 63) // 64; n_launch = (max_seqlen_k + 63) // 64
    per = ((n_blocks if n_blocks > n_launch else n_launch) + num_splits - 1) // num_splits
    n_min = split * per
    return n_min, min(n_blocks, n_min + per)

def run(d, nrows, seqlen_k, num_splits, split, Q, K8, V8, scale, kdesc, vdesc, page=16, table=None, max_seqlen_k=None):
    kBlockN, kSliceN, kChunks = 64, 16, d // 16
    kStages = 1 + 8192 // (2 * 16 * d)
    log2e = 1.4426950408889634
    scale_log2 = scale * log2e * kdesc
    n_min, n_max = split_range(seqlen_k, max_seqlen_k or seqlen_k, num_splits, split)
    # Q fragments
    qf = {}
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for h in range(2):
            row = g + 8*h
            seg = Q[row, c*(d//4):(c+1)*(d//4)] if row < nrows else np.zeros(d//4)
            qf[lane, h] = [(seg[2*m], seg[2*m+1]) for m in range(d//8)]
    RS = d + 8  # sO's padded row: [warp][row][8 t + n] holds n-atom t's column n
    sM = np.zeros((4, 16)); sL = np.zeros((4, 16)); sO = np.full((4, 16, RS), np.nan)
    for warp in range(4):
        count = max(n_max - n_min, 0)
        if count > 0 and (n_max - 1) * 64 + warp * 16 >= seqlen_k: count -= 1
        acc_o = [[[0.0]*4 for t in range(d//8)] for lane in range(32)]
        m = [[-math.inf]*2 for lane in range(32)]; l = [[0.0]*2 for lane in range(32)]
        for i in range(count):
            key0 = (n_min + i) * 64 + warp * 16
            valid = seqlen_k - key0
            # issue: staging with swizzle (physical row from the page table)
            sk = np.zeros(16 * d, dtype=np.int64); sv = np.zeros(16 * d, dtype=np.int64)
            pg = table[key0 // page]; prow = key0 % page
            for lane in range(32):
                for j in range(16 * kChunks // 32):
                    idx = lane + 32*j; r = idx // kChunks; q = idx % kChunks
                    so = (r * kChunks + (q ^ (r % kChunks))) * 16
                    if r < valid:
                        phys = pg * page + prow + r
                        sk[so:so+16] = K8[phys, q*16:q*16+16]; sv[so:so+16] = V8[phys, q*16:q*16+16]
            # S
            acc_s = [[[[0.0]*4 for h in range(2)] for a in range(2)] for lane in range(32)]
            for a in range(2):
                kwl = {}
                for lane in range(32):
                    g, c = lane // 4, lane % 4; r = 8*a + g; kw = []
                    for j in range(d // 64):
                        q = c * (d // 64) + j; off = (r * kChunks + (q ^ (r % kChunks))) * 16
                        kw += words(sk[off:off+16])
                    kwl[lane] = kw
                for s in range(d // 16):
                    Al = {}; B0 = {}; B1 = {}
                    for lane in range(32):
                        Al[lane] = [qf[lane, 0][2*s], qf[lane, 1][2*s], qf[lane, 0][2*s+1], qf[lane, 1][2*s+1]]
                        B0[lane] = pair(byte_perm(kwl[lane][s], 0, 0x1404)); B1[lane] = pair(byte_perm(kwl[lane][s], 0, 0x3424))
                    Dl = {lane: acc_s[lane][a][s & 1] for lane in range(32)}
                    mma(Dl, Al, B0, B1)
            sc = {}
            for lane in range(32):
                g, c = lane // 4, lane % 4
                sc[lane] = [[(acc_s[lane][a][0][e] + acc_s[lane][a][1][e]) * scale_log2 if 8*a + 2*c + (e & 1) < valid else -math.inf for e in range(4)] for a in range(2)]
            # quad max
            p = {}; corr = {}
            for lane in range(32):
                quad = [lane - lane % 4 + k for k in range(4)]
                mx0 = max(max(sc[x][0][0], sc[x][0][1], sc[x][1][0], sc[x][1][1]) for x in quad)
                mx1 = max(max(sc[x][0][2], sc[x][0][3], sc[x][1][2], sc[x][1][3]) for x in quad)
                n0 = max(m[lane][0], mx0); n1 = max(m[lane][1], mx1)
                b0 = 0 if n0 == -math.inf else n0; b1 = 0 if n1 == -math.inf else n1
                c0 = 2 ** (m[lane][0] - b0); c1 = 2 ** (m[lane][1] - b1)
                m[lane] = [n0, n1]
                pp = [[2 ** (sc[lane][a][0] - b0), 2 ** (sc[lane][a][1] - b0), 2 ** (sc[lane][a][2] - b1), 2 ** (sc[lane][a][3] - b1)] for a in range(2)]
                l[lane][0] = l[lane][0] * c0 + pp[0][0] + pp[0][1] + pp[1][0] + pp[1][1]
                l[lane][1] = l[lane][1] * c1 + pp[0][2] + pp[0][3] + pp[1][2] + pp[1][3]
                for t in range(d // 8):
                    acc_o[lane][t][0] *= c0; acc_o[lane][t][1] *= c0; acc_o[lane][t][2] *= c1; acc_o[lane][t][3] *= c1
                p[lane] = pp
            # PV
            vwl = {}
            for lane in range(32):
                g, c = lane // 4, lane % 4; vw = []
                for k in range(4):
                    r = 2*c + (k & 1) + 8*(k >> 1)
                    if d == 128:
                        off = (r * kChunks + (g ^ (r % kChunks))) * 16; vw.append(words(sv[off:off+16]))
                    else:
                        off = (r * kChunks + ((g // 2) ^ (r % kChunks))) * 16 + (g % 2) * 8; vw.append(words(sv[off:off+8]))
                vwl[lane] = vw
            for t in range(d // 8):
                wi, by = t // 4, t % 4; sel = ((4 + by) << 12) | (by << 4)
                Al = {}; B0 = {}; B1 = {}
                for lane in range(32):
                    pp = p[lane]
                    Al[lane] = [(pp[0][0], pp[0][1]), (pp[0][2], pp[0][3]), (pp[1][0], pp[1][1]), (pp[1][2], pp[1][3])]
                    vw = vwl[lane]
                    B0[lane] = pair(byte_perm(vw[0][wi], vw[1][wi], sel)); B1[lane] = pair(byte_perm(vw[2][wi], vw[3][wi], sel))
                mma({lane: acc_o[lane][t] for lane in range(32)}, Al, B0, B1)
        for lane in range(32):
            g, c = lane // 4, lane % 4
            quad = [lane - lane % 4 + k for k in range(4)]
            sM[warp, g] = m[lane][0]; sM[warp, g+8] = m[lane][1]
            sL[warp, g] = sum(l[x][0] for x in quad); sL[warp, g+8] = sum(l[x][1] for x in quad)
            for t in range(d // 8):
                for e in range(4):  # (float2 stores: e = 0, 1 and 2, 3 side by side)
                    sO[warp, g + 8*(e >> 1), 8*t + 2*c + (e & 1)] = acc_o[lane][t][e]
    out = np.zeros((nrows, d)); lse = np.zeros(nrows)
    for row in range(nrows):
        M = sM[:, row].max(); base = 0 if M == -math.inf else M
        fw = 2 ** (sM[:, row] - base); L = (fw * sL[:, row]).sum()
        empty = L == 0
        inv = 1 if empty else vdesc / L
        lse[row] = (-math.inf if num_splits > 1 else math.inf) if empty else (base + math.log2(L)) * math.log(2)
        # thread (row, n): head-dim positions n * d/8 + j, read at 8 j + n
        for n in range(8):
            for j in range(d // 8):
                out[row, n * (d // 8) + j] = (fw * sO[:, row, 8*j + n]).sum() * inv
    return out, lse

def merge(parts):
    # The last split's merge: one pass in split order, a running max; empty splits skipped.
    d = parts[0][0].shape[1]; nrows = parts[0][0].shape[0]
    out = np.zeros((nrows, d)); lse = np.zeros(nrows)
    for row in range(nrows):
        acc = np.zeros(d); lmax = -math.inf; lsum = 0.0
        for o, l in parts:
            if l[row] == -math.inf: continue
            nmax = max(lmax, l[row]); keep = math.exp(lmax - nmax); w = math.exp(l[row] - nmax)
            lmax = nmax; lsum = lsum * keep + w; acc = acc * keep + w * o[row]
        none = lsum == 0
        out[row] = 0 if none else acc / lsum
        lse[row] = math.inf if none else math.log(lsum) + lmax
    return out, lse

def ref(d, nrows, seqlen_k, num_splits, split, Q, K8, V8, scale, kdesc, vdesc, page, table, max_seqlen_k=None):
    keys = np.arange(seqlen_k)
    rows = np.array([table[k // page] * page + k % page for k in keys], dtype=int)
    n_min, n_max = split_range(seqlen_k, max_seqlen_k or seqlen_k, num_splits, split)
    rows = rows[n_min * 64:max(n_min, n_max) * 64]
    K = DEC[K8[rows]] * kdesc; V = DEC[V8[rows]] * vdesc
    S = Q[:nrows] @ K.T * scale
    if len(rows) == 0: return np.zeros((nrows, d)), None
    mx = S.max(1, keepdims=True); P = np.exp(S - mx)
    return (P @ V) / P.sum(1, keepdims=True), (mx[:, 0] + np.log(P.sum(1)))

worst = 0
for d in (128, 64):
    for (nrows, seqlen_k, ns, sp, page) in [(4, 100, 1, 0, 16), (4, 37, 1, 0, 16), (16, 200, 3, 1, 32), (5, 130, 2, 1, 64), (4, 64 * 5 + 7, 2, 1, 16), (4, 9, 1, 0, 16)]:
        npages = (seqlen_k + page - 1) // page + 3
        table = rng.permutation(npages)
        Q = rng.standard_normal((16, d)).astype(np.float32)
        K8 = rng.integers(0, 256, (npages * page, d)); V8 = rng.integers(0, 256, (npages * page, d))
        K8[(K8 & 0x7F) == 0x7F] = 0; V8[(V8 & 0x7F) == 0x7F] = 0  # no NaN codes
        scale = 1 / math.sqrt(d) * 0.05
        o, lse = run(d, nrows, seqlen_k, ns, sp, Q, K8, V8, scale, 0.7, 1.3, page, table)
        r, rl = ref(d, nrows, seqlen_k, ns, sp, Q, K8, V8, scale, 0.7, 1.3, page, table)
        err = np.abs(o - r).max() / (np.abs(r).max() + 1e-30)
        lerr = np.abs(lse - rl).max() if rl is not None else 0
        worst = max(worst, err, lerr)
        print(d, nrows, seqlen_k, ns, sp, page, f"rel err {err:.2e} lse err {lerr:.2e}")
    # Every split of a sequence, cut from a longer launch (or, at 300 < 327, its own length),
    # merged by the last split, against attention over the whole sequence.
    for (nrows, seqlen_k, max_k, ns) in [(4, 64 * 5 + 7, 64 * 9, 6), (4, 64 * 5 + 7, 300, 3), (16, 200, 200, 3), (5, 64 * 7, 64 * 7, 7)]:
        page = 16; npages = (max(seqlen_k, max_k) + page - 1) // page + 3
        table = rng.permutation(npages)
        Q = rng.standard_normal((16, d)).astype(np.float32)
        K8 = rng.integers(0, 256, (npages * page, d)); V8 = rng.integers(0, 256, (npages * page, d))
        K8[(K8 & 0x7F) == 0x7F] = 0; V8[(V8 & 0x7F) == 0x7F] = 0
        scale = 1 / math.sqrt(d) * 0.05
        parts = [run(d, nrows, seqlen_k, ns, sp, Q, K8, V8, scale, 0.7, 1.3, page, table, max_k) for sp in range(ns)]
        o, lse = merge(parts)
        r, rl = ref(d, nrows, seqlen_k, 1, 0, Q, K8, V8, scale, 0.7, 1.3, page, table)
        err = np.abs(o - r).max() / (np.abs(r).max() + 1e-30); lerr = np.abs(lse - rl).max()
        worst = max(worst, err, lerr)
        print(d, nrows, seqlen_k, f"launch max {max_k}, {ns} splits merged: rel err {err:.2e} lse err {lerr:.2e}")
print("worst", worst)
