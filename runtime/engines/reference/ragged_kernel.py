"""ragged.py's Triton kernel (imported only where Triton runs: ragged._kernel).

One program attends one work item's queries for one KV head over one split of the item's row's
table. An item is up to T tokens of one row (UNIFORM: row `item` of R rows of T tokens, packed
row-major; else ITEMS [3, I] = (slot, first packed token, tokens), T = ragged.ITEM_TOKENS), its
M = tokens x G queries: query m -> token m // G, head h*G + m % G.
With ROPE (uniform rows only) the queries come unrotated in the rows' qkv ([N, (nh + 2 kvh) * hd],
Q unused) and each program rotates its own; the program whose tiles hold a new token's position
writes that token's K (rotated) and V before it reads, so a decode layer's attention is one
launch. Work items read every key from the pool: their rows' new K/V are written before the
launch (the model's Kernels.rope_write: rope_kernel.py's Triton kernel on CUDA), since an item of a
chunk reads keys that other programs' items bring (docs/design.md, "The ragged attention kernel")."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["QPOS", "ITEMS", "n_items", "splits", "per"])
def ragged_paged_attention(
        Q, K, V, TABLES, QPOS, O, PART, ML, COUNT, ITEMS, QKV, COS, SIN, WIDX, scale, n_tiles, n_items, splits, per,
        stride_qn, stride_qh, stride_kh, stride_kp, stride_vh, stride_vp, stride_tr,
        stride_on, stride_oh, stride_xn, stride_cs,
        T: tl.constexpr, G: tl.constexpr, KVH: tl.constexpr, HD: tl.constexpr, BS: tl.constexpr,
        TILE_N: tl.constexpr, BLOCK_M: tl.constexpr, SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr,
        PER: tl.constexpr, ROPE: tl.constexpr, UNIFORM: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    s = tl.program_id(1)
    it = pid // KVH
    h = (pid % KVH).to(tl.int64)
    if UNIFORM:                                       # launch constants: static loops (decode steps)
        row = it
        q0 = it * T
        qn = T
        nsplit = SPLITS
        width = SPLITS
        per = PER
    else:                                             # runtime: one compiled kernel for every item count
        row = tl.load(ITEMS + it)                     # the row's slot: TABLES is the whole block table
        q0 = tl.load(ITEMS + n_items + it)
        qn = tl.load(ITEMS + 2 * n_items + it)
        nsplit = splits
        width = splits                                # partials laid out by the launch's splits
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HD)
    offs_n = tl.arange(0, TILE_N)
    valid = offs_m < qn * G
    t = offs_m // G
    head = h * G + offs_m % G
    tok = q0 + t                                                                  # [M] packed token
    qpos = tl.load(QPOS + tok, mask=valid, other=0).to(tl.int32)                  # [M]
    if ROPE:                                          # uniform rows: q rotated here, new K/V written
        q = _rope_and_write(QKV, COS, SIN, QPOS, WIDX, K, V, tok, head, valid, q0, h, s * per * TILE_N,
                            (s * per + per) * TILE_N, stride_xn, stride_cs, stride_kh, stride_kp, stride_vh,
                            stride_vp, T, G, KVH, HD)
    else:
        q = tl.load(Q + tok[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                    mask=valid[:, None], other=0.0)                              # [M, HD]
    last = tl.max(qpos, axis=0)
    if not UNIFORM:                                       # the tiles and splits that hold a key of this item:
        need = tl.where(qn > 0, last // TILE_N + 1, 0)    # an item of a short row takes one split (no merge),
        nsplit = tl.maximum(1, tl.minimum(splits, tl.cdiv(need, per)))   # an empty one (padding) none
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD], tl.float32)
    end = s * per + per
    if not UNIFORM:                                       # a chunk's early items stop at their last key
        end = tl.minimum(end, need)
    for j in range(s * per, end):
        key = j * TILE_N + offs_n                                                 # [N] logical positions
        page = tl.load(TABLES + row * stride_tr + (j * TILE_N) // BS, mask=j < n_tiles, other=0).to(tl.int64)
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
    if nsplit == 1:                                       # the whole row in program 0: no merge
        if s == 0:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(O + tok[:, None] * stride_on + head[:, None] * stride_oh + offs_d[None, :],
                     out.to(O.dtype.element_ty), mask=valid[:, None])
    elif s < nsplit:
        _store_and_merge(PART, ML, COUNT, O, acc, m_i, l_i, pid, s, width, nsplit, qn, q0, h, offs_m, offs_d, valid,
                         stride_on, stride_oh, G, HD, BLOCK_M, SPLITS_P2)


@triton.jit
def _rope_and_write(QKV, COS, SIN, QPOS, WIDX, K, V, tok, head, valid, q0, h, lo, hi, stride_xn, stride_cs,
                    stride_kh, stride_kp, stride_vh, stride_vp, T: tl.constexpr, G: tl.constexpr,
                    KVH: tl.constexpr, HD: tl.constexpr):
    """-> q [M, HD], the program's queries rotated; the row's new tokens whose positions fall in
    [lo, hi), this program's keys, get their K (rotated) and V written to the pool, seen by the
    program's own tile loads after the barrier.
    Rotate-half RoPE at float32, as rope_kernel.py: out[d] = x[d] cos[d % H] + sign[d] x[(d + H) % HD]
    sin[d % H], sign -1 on the first half (x1 c - x2 s | x2 c + x1 s), cast once to the pool's dtype."""
    HALF: tl.constexpr = HD // 2
    offs_d = tl.arange(0, HD)
    half = offs_d % HALF
    partner = (offs_d + HALF) % HD
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    src = QKV + tok[:, None] * stride_xn + head[:, None] * HD                     # q head `head` of token `tok`
    cs = tok[:, None] * stride_cs + half[None, :]
    x = tl.load(src + offs_d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    xr = tl.load(src + partner[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
    c = tl.load(COS + cs, mask=valid[:, None], other=0.0).to(tl.float32)
    sn = tl.load(SIN + cs, mask=valid[:, None], other=0.0).to(tl.float32)
    q = (x * c + (sign[None, :] * xr) * sn).to(K.dtype.element_ty)               # [M, HD]
    for tt in tl.static_range(T):                                                 # the row's new tokens
        n = q0 + tt
        newpos = tl.load(QPOS + n)
        wat = tl.load(WIDX + n)                                                   # pool position of newpos
        pv = offs_d * 0 + newpos                                                  # [HD] (a scalar mask fails the interpreter)
        mine = (pv >= lo) & (pv < hi)                                             # one program writes it
        ksrc = QKV + n * stride_xn + (KVH * G + h) * HD
        kx = tl.load(ksrc + offs_d).to(tl.float32)
        kxr = tl.load(ksrc + partner).to(tl.float32)
        kc = tl.load(COS + n * stride_cs + half).to(tl.float32)
        ks = tl.load(SIN + n * stride_cs + half).to(tl.float32)
        tl.store(K + h * stride_kh + wat * stride_kp + offs_d, (kx * kc + (sign * kxr) * ks).to(K.dtype.element_ty),
                 mask=mine)
        tl.store(V + h * stride_vh + wat * stride_vp + offs_d, tl.load(ksrc + KVH * HD + offs_d), mask=mine)
    tl.debug_barrier()                                    # the stores seen by this program's tile loads
    return q


@triton.jit
def _store_and_merge(PART, ML, COUNT, O, acc, m_i, l_i, pid, s, width, nsplit, qn, q0, h, offs_m, offs_d, valid,
                     stride_on, stride_oh, G: tl.constexpr, HD: tl.constexpr, BLOCK_M: tl.constexpr,
                     SPLITS_P2: tl.constexpr):
    """Split s's partial (acc, m, l) stored; the last of the item's nsplit programs to finish (an
    atomic counter it resets, so a graph may replay the launch) merges every split's partial,
    query by query, into the output (only the item's qn * G queries)."""
    part = (pid * width + s) * BLOCK_M
    tl.store(PART + (part + offs_m)[:, None] * HD + offs_d[None, :], acc, mask=valid[:, None])
    tl.store(ML + (part + offs_m) * 2, m_i, mask=valid)
    tl.store(ML + (part + offs_m) * 2 + 1, l_i, mask=valid)
    tl.debug_barrier()                                    # every thread's partial stored ...
    done = tl.atomic_add(COUNT + pid, 1, sem="acq_rel")   # ... before this release
    if done == nsplit - 1:
        offs_s = tl.arange(0, SPLITS_P2)
        live = offs_s < nsplit
        rows = (pid * width + offs_s) * BLOCK_M                                          # [S2]
        for mi in range(0, qn * G):
            ms = tl.load(ML + (rows + mi) * 2, mask=live, other=float("-inf"), cache_modifier=".cg")   # [S2]
            ls = tl.load(ML + (rows + mi) * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
            acc_s = tl.load(PART + (rows + mi)[:, None] * HD + offs_d[None, :], mask=live[:, None],
                            other=0.0, cache_modifier=".cg")                             # [S2, HD]
            m_all = tl.max(ms, axis=0)
            w = tl.exp(ms - tl.where(m_all == float("-inf"), 0.0, m_all))                 # [S2]
            l_all = tl.sum(w * ls, axis=0)
            out = tl.sum(w[:, None] * acc_s, axis=0) / tl.where(l_all == 0.0, 1.0, l_all)   # [HD]
            tl.store(O + (q0 + mi // G) * stride_on + (h * G + mi % G) * stride_oh + offs_d,
                     out.to(O.dtype.element_ty))
        tl.atomic_xchg(COUNT + pid, 0)                    # ready for the next launch (and graph replay)
