"""vocab_parallel_linear_cross_entropy: a vocab-parallel lm head + its loss, no rank holding logits
of more than one row chunk of its own shard (issue 9's linear variant).

Built from the same pieces as vocab_parallel_cross_entropy (the fusedloss::vp_ce_* ops of header
section 8) and cuBLAS GEMMs through torch.matmul, one row chunk at a time:

    for each chunk of rows:  z = h_c W_r^T (+ b_r)        # [C, V_local]: the only logits held
                             stats = step 1 (z)           # 16 bytes per row
                             all-gather stats (group)     # O(C) bytes, the only collective per chunk
                             loss_c, lse_c = step 3
                             dz = step 4 (z, lse_c)       # gradient formed now ("mode 1")
                             dh_c = dz W_r ; dW_r += dz^T h_c (fp32) ; db_r += sum(dz)
    dh all-reduced over the group (reduce_dhidden=True: h is replicated over the tensor-parallel
    group, as a column-parallel lm head's input is)

So 3 GEMMs per rank (6 N H V_local FLOP), the single-GPU linear CE's count at V / k, plus one
all-gather of 16 C bytes per chunk and one all-reduce of dh (N H elements) per call. For
reduction='none' the gradient needs the per-row upstream gradient, known only in backward: the
forward keeps lse and the backward recomputes z per chunk (4 GEMMs, "mode 2").

Limits (raised, not silently wrong): reduction='mean' with class weights AND z_loss together (the
two parts have different denominators and step 4 takes one per-row factor; both alone are fine);
torch.compile traces it with graph breaks (a Python loop with collectives), CUDA graphs untested.
"""
import torch
from torch import Tensor

from . import ops  # noqa: F401  (registers torch.ops.fusedloss.*)
from ._lib import REDUCTIONS
from .functional import _ce_options, _int_arg, _vp_dist, _autocast_dtype

_F32 = torch.float32


def _gather(st, group, k):
    if k == 1:
        return st.unsqueeze(0)
    out = torch.empty((k * st.shape[0], 4), dtype=st.dtype, device=st.device)
    torch.distributed.all_gather_into_tensor(out, st.contiguous(), group=group)
    return out.view(k, st.shape[0], 4)


def _chunk_logits(h, W, b):
    z = h @ W.t()
    if b is not None:
        z = z + b
    return z.contiguous()


def _grad_buffers(h, W, b, need_h, need_w, need_b, cdt):
    """dh (compute dtype), dW and db (fp32 accumulators) where wanted, else None."""
    dh = torch.empty(h.shape, dtype=cdt, device=h.device) if need_h else None
    dW = torch.zeros(W.shape, dtype=_F32, device=h.device) if need_w else None
    db = torch.zeros(W.shape[0], dtype=_F32, device=h.device) if (b is not None and need_b) else None
    return dh, dW, db


def _chunk_grads(dz, hc, Wc, r0, r1, dh, dW, db):
    """One chunk's share of the gradients from its dlogits dz: dh rows, dW and db accumulated."""
    if dh is not None:
        dh[r0:r1] = dz @ Wc
    if dW is not None:
        dW += (dz.t() @ hc).to(_F32)
    if db is not None:
        db += dz.sum(0, dtype=_F32)


class _VPLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, W, b, t, cw, vocab_start, V, ce, group, k, chunk, reduce_dh, cdt):
        ii, red, eps, zl, cap, scale = ce
        none = red == REDUCTIONS["none"]
        ce_rows = (ii, REDUCTIONS["none"], eps, zl, cap, scale)
        N, H = h.shape
        hc_all, Wc = h.to(cdt), W.to(cdt)
        bc = b.to(cdt) if b is not None else None
        loss_rows = torch.empty(N, dtype=_F32, device=h.device)
        lse = torch.empty(N, dtype=_F32, device=h.device)
        valid = t != ii
        Dn = valid.sum().to(_F32)
        if cw is not None:
            Dw = (cw[t.clamp(0, V - 1)] * valid).sum()
        else:
            Dw = Dn
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        mode1 = grads and not none
        if mode1:
            dh, dW, db = _grad_buffers(h, W, b, *ctx.needs_input_grad[:3], cdt)
            # MEAN: 1 / D_w for every row (D_w = D_n without class weights; class weights and
            # z_loss together are refused for MEAN, see the module docstring)
            g_row = (1.0 / Dw if red == REDUCTIONS["mean"] else torch.ones((), device=h.device)).reshape(1).to(_F32)
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            hc, tc = hc_all[r0:r1], t[r0:r1]
            z = _chunk_logits(hc, Wc, bc)
            st = torch.ops.fusedloss.vp_ce_local_stats(z, tc, cw, vocab_start, V, *ce_rows)
            lc, lsec = torch.ops.fusedloss.vp_ce_combine(_gather(st, group, k), tc, cw, V, *ce_rows)
            loss_rows[r0:r1] = lc
            lse[r0:r1] = lsec
            if mode1:
                g = g_row.expand(r1 - r0).contiguous()
                dz = torch.ops.fusedloss.vp_ce_backward(g, z, tc, lsec, cw, vocab_start, V, *ce_rows, 1.0)
                _chunk_grads(dz, hc, Wc, r0, r1, dh, dW, db)
        # the reduction: a_i = CE (+ smoothing) part, b_i = z-loss part (own denominator D_n)
        if none:
            loss = loss_rows
        elif red == REDUCTIONS["sum"]:
            loss = loss_rows.sum()
        else:
            zpart = (zl * lse * lse * valid) if zl else None
            a = loss_rows - zpart if zpart is not None else loss_rows
            loss = a.sum() / Dw + (zpart.sum() / Dn if zpart is not None else 0.0)
        ctx.meta = (vocab_start, V, ce_rows, group, k, chunk, reduce_dh, cdt, none, W.dtype, h.dtype,
                    None if b is None else b.dtype)
        if mode1:
            if dh is not None and reduce_dh and k > 1:
                torch.distributed.all_reduce(dh, group=group)
            ctx.save_for_backward(dh, dW, db)
            ctx.mode1 = True
        elif grads:
            ctx.save_for_backward(h, W, b, t, cw, lse)
            ctx.mode1 = False
        return loss

    @staticmethod
    def backward(ctx, gout):
        vocab_start, V, ce_rows, group, k, chunk, reduce_dh, cdt, none, wdt, hdt, bdt = ctx.meta
        if ctx.mode1:
            dh, dW, db = ctx.saved_tensors
            G = gout.to(_F32)
            return (None if dh is None else (dh.to(_F32) * G).to(hdt),
                    None if dW is None else (dW * G).to(wdt),
                    None if db is None else (db * G).to(bdt),
                    None, None, None, None, None, None, None, None, None, None)
        h, W, b, t, cw, lse = ctx.saved_tensors
        N, H = h.shape
        hc_all, Wc = h.to(cdt), W.to(cdt)
        bc = b.to(cdt) if b is not None else None
        dh, dW, db = _grad_buffers(h, W, b, *ctx.needs_input_grad[:3], cdt)
        g_all = gout.reshape(-1).to(_F32).contiguous()
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            hc, tc = hc_all[r0:r1], t[r0:r1]
            z = _chunk_logits(hc, Wc, bc)
            dz = torch.ops.fusedloss.vp_ce_backward(g_all[r0:r1].contiguous(), z, tc, lse[r0:r1].contiguous(), cw,
                                                    vocab_start, V, *ce_rows, 1.0)
            _chunk_grads(dz, hc, Wc, r0, r1, dh, dW, db)
        if dh is not None and reduce_dh and k > 1:
            torch.distributed.all_reduce(dh, group=group)
        return (None if dh is None else dh.to(hdt), None if dW is None else dW.to(wdt),
                None if db is None else db.to(bdt), None, None, None, None, None, None, None, None, None, None)


def vocab_parallel_linear_cross_entropy(hidden, weight, target, vocab_start, vocab_end, group=None,
                                        bias=None, ignore_index=-100, reduction="mean",
                                        label_smoothing=0.0, *, class_weight=None, z_loss=0.0,
                                        softcap=None, logit_scale=1.0, vocab_size=None,
                                        chunk_rows=2048, reduce_dhidden=True):
    r"""Cross-entropy of ``hidden @ weight.T (+ bias)`` with the lm head's weight rows sharded by
    vocabulary over the ranks of ``group`` (a Megatron-style column-parallel lm head), without any
    rank holding more logits than one chunk of rows of its own shard.

    - ``hidden``: (..., H), the same on every rank; ``weight``: this rank's rows (V_local, H) for
      the classes ``[vocab_start, vocab_end)``; ``bias``: (V_local,) or None; ``target``: GLOBAL
      class ids of shape ``hidden.shape[:-1]``. Shards in rank order, as
      :func:`fusedloss.vocab_parallel_cross_entropy` (uneven allowed).
    - options as :func:`fusedloss.vocab_parallel_cross_entropy` (``class_weight`` = its ``weight``,
      the GLOBAL (V,) class weights; label smoothing over the whole vocabulary).
    - ``reduce_dhidden``: all-reduce (sum) hidden's gradient over ``group`` (True: hidden is
      replicated over the group, the usual case); False leaves it to the caller's engine.
    - ``chunk_rows``: rows per chunk (the logits held at once: chunk_rows x V_local).
    Returns the loss (float32; per row for ``reduction='none'``), the same on every rank.
    Costs: module docstring (3 GEMMs per rank for 'mean'/'sum'; 4 for 'none').
    """
    fn = "vocab_parallel_linear_cross_entropy"
    for name, v in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(v, Tensor):
            raise TypeError(f"{fn}: {name} must be a Tensor, got {type(v).__name__}")
    red, ignore_index, label_smoothing, z_loss, cap, logit_scale = _ce_options(
        fn, reduction, ignore_index, label_smoothing, z_loss, softcap, logit_scale)
    vocab_start = _int_arg(fn, "vocab_start", vocab_start)
    vocab_end = _int_arg(fn, "vocab_end", vocab_end)
    chunk_rows = _int_arg(fn, "chunk_rows", chunk_rows)
    if chunk_rows < 1:
        raise ValueError(f"{fn}: chunk_rows must be >= 1, got {chunk_rows}")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"{fn}: weight must be (V_local, H) with H = hidden.shape[-1] "
                         f"({hidden.shape[-1]}), got {tuple(weight.shape)}")
    Vl = weight.shape[0]
    if vocab_start < 0 or vocab_end - vocab_start != Vl:
        raise ValueError(f"{fn}: [vocab_start, vocab_end) = [{vocab_start}, {vocab_end}) must have "
                         f"weight.shape[0] = {Vl} classes, with vocab_start >= 0")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != Vl):
        raise ValueError(f"{fn}: bias must be (V_local,) = ({Vl},), got {tuple(bias.shape)}")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"{fn}: target must have shape {tuple(hidden.shape[:-1])}, got "
                         f"{tuple(target.shape)}")
    dev = hidden.device
    if weight.device != dev or target.device != dev or (bias is not None and bias.device != dev):
        raise ValueError(f"{fn}: hidden, weight, bias and target must be on one device")
    dist = _vp_dist()
    if dist is None:
        if group is not None:
            raise ValueError(f"{fn}: group was given but torch.distributed is not initialised")
        k, rank = 1, 0
    else:
        if group is None:
            group = dist.group.WORLD
        k, rank = dist.get_world_size(group), dist.get_rank(group)
        if rank < 0:
            raise ValueError(f"{fn}: this process is not a member of group")
    V = vocab_end if (vocab_size is None and k == 1) else vocab_size
    if V is None:
        raise ValueError(f"{fn}: vocab_size (the global V) is required with more than one rank")
    V = _int_arg(fn, "vocab_size", V)
    if vocab_end > V or (rank == 0 and vocab_start != 0) or (rank == k - 1 and vocab_end != V):
        raise ValueError(f"{fn}: rank {rank} of {k} holds [{vocab_start}, {vocab_end}) of V = {V}: shards "
                         "must tile [0, V) in rank order")
    cw = None
    if class_weight is not None:
        if class_weight.dim() != 1 or class_weight.shape[0] != V:
            raise ValueError(f"{fn}: class_weight must be the GLOBAL (V,) = ({V},) class weights")
        cw = class_weight.detach().to(device=dev, dtype=_F32).contiguous()
    if red == REDUCTIONS["mean"] and cw is not None and z_loss:
        raise NotImplementedError(f"{fn}: reduction='mean' with class_weight and z_loss together is not "
                                  "supported (their parts have different denominators); use either, "
                                  "or reduction='sum' and divide")
    cdt = _autocast_dtype(dev.type) or hidden.dtype  # the GEMMs' dtype, as F.linear's under autocast
    h = hidden.reshape(-1, hidden.shape[-1])
    t = target.reshape(-1).contiguous()
    ce = (ignore_index, red, label_smoothing, z_loss, cap, logit_scale)
    with torch.autocast(dev.type, enabled=False):
        loss = _VPLinearCE.apply(h, weight, bias, t, cw, vocab_start, V, ce, group, k, chunk_rows,
                                 bool(reduce_dhidden), cdt)
    if red == REDUCTIONS["none"]:
        loss = loss.reshape(target.shape)
    return loss
