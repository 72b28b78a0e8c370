"""paged_decode.py's Triton kernel (imported only where Triton runs: paged_decode._kernel).
With ROPE the queries come unrotated in the rows' qkv ([N, (nh + 2 kvh) * hd], Q unused): each program
rotates its own queries, and the program whose tiles hold a new token's position writes that token's
K (rotated) and V into the pool before it reads (model.rope_write's work, one launch fewer a layer)."""
import triton
import triton.language as tl


@triton.jit
def paged_decode(Q, K, V, TABLES, QPOS, O, PART, ML, COUNT, QKV, COS, SIN, WIDX, scale, n_tiles,
                 stride_qn, stride_qh, stride_kh, stride_kp, stride_vh, stride_vp, stride_tr,
                 stride_on, stride_oh, stride_xn, stride_cs,
                 T: tl.constexpr, G: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, BS: tl.constexpr,
                 TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
                 PER: tl.constexpr, MQ: tl.constexpr, ROPE: tl.constexpr,
                 IEEE: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    r = pid // KVH
    h = (pid % KVH).to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HD)
    offs_n = tl.arange(0, TILE_N)
    valid = offs_m < T * G
    t = offs_m // G
    head = h * G + offs_m % G
    # the split's tiles come from the table width (PER a program), not the row's length, so the
    # table, q and position loads issue together (the table's mask needs no loaded value); tiles
    # past the row's last position load no K/V. Under ROPE every program also loads its row's new
    # tokens and waits at the barrier before its K/V loads (the cost of the launch saved)
    qpos = tl.load(QPOS + r * T + t, mask=valid, other=0).to(tl.int32)           # [M]
    if ROPE:
        # rotate-half RoPE at float32, as rope_kernel.py: out[d] = x[d] cos[d % H] + sign[d] x[(d + H) % HD]
        # sin[d % H], sign -1 on the first half (x1 c - x2 s | x2 c + x1 s), cast once to the pool's dtype
        HALF: tl.constexpr = HD // 2
        half = offs_d % HALF
        partner = (offs_d + HALF) % HD
        sign = tl.where(offs_d < HALF, -1.0, 1.0)
        tok = r * T + t                                                           # [M] packed token
        src = QKV + tok[:, None] * stride_xn + head[:, None] * HD                 # q head `head` of token `tok`
        cs = tok[:, None] * stride_cs + half[None, :]
        x = tl.load(src + offs_d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        xr = tl.load(src + partner[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        c = tl.load(COS + cs, mask=valid[:, None], other=0.0).to(tl.float32)
        sn = tl.load(SIN + cs, mask=valid[:, None], other=0.0).to(tl.float32)
        q = (x * c + (sign[None, :] * xr) * sn).to(K.dtype.element_ty)           # [M, HD]
        lo, hi = s * PER * TILE_N, (s * PER + PER) * TILE_N                       # this program's keys
        for tt in tl.static_range(T):                                             # row r's new tokens
            n = r * T + tt
            newpos = tl.load(QPOS + n)
            wat = tl.load(WIDX + n)                                               # pool position of newpos
            pv = offs_d * 0 + newpos                                               # [HD] (a scalar mask fails the interpreter)
            mine = (pv >= lo) & (pv < hi)                                         # one program writes it
            ksrc = QKV + n * stride_xn + (KVH * G + h) * HD
            kx = tl.load(ksrc + offs_d).to(tl.float32)
            kxr = tl.load(ksrc + partner).to(tl.float32)
            kc = tl.load(COS + n * stride_cs + half).to(tl.float32)
            ks = tl.load(SIN + n * stride_cs + half).to(tl.float32)
            tl.store(K + h * stride_kh + wat * stride_kp + offs_d, (kx * kc + (sign * kxr) * ks).to(K.dtype.element_ty),
                     mask=mine)
            tl.store(V + h * stride_vh + wat * stride_vp + offs_d, tl.load(ksrc + KVH * HD + offs_d), mask=mine)
        tl.debug_barrier()                                # the stores seen by this program's tile loads
    else:
        q = tl.load(Q + (r * T + t)[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                    mask=valid[:, None], other=0.0)                              # [M, HD]
    last = tl.max(qpos, axis=0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD], tl.float32)
    for j in range(s * PER, s * PER + PER):
        key = j * TILE_N + offs_n                                                 # [N] logical positions
        page = tl.load(TABLES + r * stride_tr + (j * TILE_N) // BS, mask=j < n_tiles, other=0).to(tl.int64)
        slot = page * BS + (j * TILE_N) % BS + offs_n                             # [N] pool positions
        used = (key <= last)[:, None]
        k = tl.load(K + h * stride_kh + slot[:, None] * stride_kp + offs_d[None, :], mask=used, other=0.0)
        v = tl.load(V + h * stride_vh + slot[:, None] * stride_vp + offs_d[None, :], mask=used, other=0.0)
        if IEEE:
            sc = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            sc = tl.dot(q, tl.trans(k))
        sc = tl.where(key[None, :] <= qpos[:, None], sc * scale, float("-inf"))  # [M, N]
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(sc - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    part = (pid * SPLITS + s) * BLOCK_M
    tl.store(PART + (part + offs_m)[:, None] * HD + offs_d[None, :], acc, mask=valid[:, None])
    tl.store(ML + (part + offs_m) * 2, m_i, mask=valid)
    tl.store(ML + (part + offs_m) * 2 + 1, l_i, mask=valid)
    tl.debug_barrier()                                    # every thread's partial stored ...
    done = tl.atomic_add(COUNT + pid, 1, sem="acq_rel")   # ... before this release
    if done == SPLITS - 1:                                # the last program merges: every split's (m, l) of
        offs_s = tl.arange(0, SPLITS_P2)                  # all MQ queries in one load, then each query's
        offs_q = tl.arange(0, MQ)                         # partials, all loads ahead of the one store
        live = offs_s < SPLITS
        rows = (pid * SPLITS + offs_s) * BLOCK_M                                     # [S2]
        at = (rows[:, None] + offs_q[None, :]) * 2                                   # [S2, MQ]
        used = live[:, None] & (offs_q < T * G)[None, :]
        ms = tl.load(ML + at, mask=used, other=float("-inf"), cache_modifier=".cg")
        ls = tl.load(ML + at + 1, mask=used, other=0.0, cache_modifier=".cg")
        m_all = tl.max(ms, axis=0)                                                   # [MQ]
        w = tl.exp(ms - tl.where(m_all == float("-inf"), 0.0, m_all)[None, :])      # [S2, MQ]
        l_all = tl.sum(w * ls, axis=0)
        w = w / tl.where(l_all == 0.0, 1.0, l_all)[None, :]
        out = tl.zeros([MQ, HD], tl.float32)
        for mi in tl.static_range(T * G):
            acc_s = tl.load(PART + (rows + mi)[:, None] * HD + offs_d[None, :], mask=live[:, None], other=0.0,
                            cache_modifier=".cg")                                    # [S2, HD]
            wm = tl.sum(tl.where(offs_q[None, :] == mi, w, 0.0), axis=1)             # [S2]: w[:, mi]
            out = tl.where(offs_q[:, None] == mi, tl.sum(wm[:, None] * acc_s, axis=0)[None, :], out)
        tl.store(O + (r * T + offs_q // G)[:, None] * stride_on + (h * G + offs_q % G)[:, None] * stride_oh
                 + offs_d[None, :], out.to(O.dtype.element_ty), mask=(offs_q < T * G)[:, None])
        tl.atomic_xchg(COUNT + pid, 0)                    # ready for the next launch (and graph replay)
