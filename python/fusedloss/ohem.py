"""fusedloss.ohem — online hard example mining cross-entropy (issue 8 item 5), the semantics of
HRNet-Semantic-Segmentation's OhemCrossEntropy (also OCNet / CCNet's OhemCrossEntropy2d):

    loss = fusedloss.ohem_cross_entropy(seg_logits, seg_target, thresh=0.7, min_kept=100000,
                                        ignore_index=255)
    criterion = fusedloss.OhemCrossEntropyLoss(thresh=0.7, min_kept=100000, ignore_index=255)

For logits x [N, C] (or [N, C, d1, ...], the class dimension 1) and class targets y:
  l_i   = the per-position cross-entropy (fusedloss.cross_entropy, reduction 'none': class
          weights, label smoothing, z-loss, softcap, logit_scale and logit_offset as there)
  p_i   = exp(z_{i,y_i} - lse_i), the softmax probability of the target (no gradient)
  valid = positions whose target is not ignore_index; p sorted ascending over them: s_0 <= s_1 ...
  threshold = max(s_min(min_kept, n_valid - 1), thresh)
  kept  = valid positions with p_i < threshold        (strictly: HRNet's rule, ties included)
  loss  = mean of l_i over the kept positions          (NaN when none is kept, as a mean of nothing)
So at least min_kept of the hardest valid positions are kept (fewer only if there are fewer valid
positions, or if ties at the threshold fall out), and every position the model gives a target
probability below thresh. The gradient is that of the mean over the kept set, which is fixed by the
forward (no gradient through the selection). reduction 'sum' gives the sum over the kept set,
'none' the per-position losses with the positions not kept set to 0.

Differences from the references, on purpose: p is exp(z_t - lse) from the fp32 lse (the references
take softmax in the logits' dtype, so bf16 ties at the threshold may fall differently); ignore_index
defaults to -100 (PyTorch's; the segmentation codebases use 255); mmseg's OHEMPixelSampler divides
by all (or all valid) positions instead of the kept ones — pass reduction='sum' and divide yourself
for that.

Cost: the fused cross-entropy forward (one read of the logits), a gather of the target logits, a
sort of the valid positions' p (N d floats), and the cross-entropy backward for the kept mask (one
read + one write). Everything stays on the device (no host sync: the threshold is a tensor), and
the shapes do not depend on the data, so it traces under torch.compile.
"""
import torch
from torch import Tensor

from .functional import cross_entropy

__all__ = ["ohem_cross_entropy", "OhemCrossEntropyLoss"]

_REDUCTIONS = ("mean", "sum", "none")


def _check(fn, thresh, min_kept, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{fn}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if isinstance(min_kept, bool) or not isinstance(min_kept, int) or min_kept < 0:
        raise ValueError(f"{fn}: min_kept must be an int >= 0, got {min_kept!r}")
    if thresh is not None:
        t = float(thresh)
        if not (0.0 <= t <= 1.0):
            raise ValueError(f"{fn}: thresh must be in [0, 1] (a probability) or None, got {thresh!r}")


def _target_z(input, target, ignore_index, logit_scale, softcap, logit_offset):
    """(z_t, valid): the transformed target logit per position (softcap(s x_t) + o_t, the kernels'
    map; fp32, no gradient) and the mask of positions not ignored (ignored ones read class 0)."""
    cdim = 1 if input.dim() >= 2 else 0
    valid = target != ignore_index
    t = torch.where(valid, target, torch.zeros_like(target)).long()
    zt = input.detach().gather(cdim, t.unsqueeze(cdim)).squeeze(cdim).float()
    if logit_scale != 1.0:
        zt = zt * float(logit_scale)
    if softcap is not None and float(softcap) > 0.0:
        zt = float(softcap) * torch.tanh(zt / float(softcap))
    if logit_offset is not None:
        zt = zt + logit_offset.detach().float().to(zt.device)[t]
    return zt, valid


def ohem_cross_entropy(input: Tensor, target: Tensor, thresh=0.7, min_kept: int = 100000,
                       weight=None, ignore_index: int = -100, reduction: str = "mean",
                       label_smoothing: float = 0.0, *, z_loss: float = 0.0, softcap=None,
                       logit_scale: float = 1.0, logit_offset=None) -> Tensor:
    """OHEM cross-entropy (see the module docstring): the mean of the per-position cross-entropy
    over the positions kept by HRNet's rule (target probability below max(thresh, the min_kept-th
    smallest probability)). thresh None keeps exactly the min_kept hardest positions by
    probability (the threshold is then the min_kept-th smallest probability alone)."""
    fn = "fusedloss.ohem_cross_entropy"
    _check(fn, thresh, min_kept, reduction)
    if not isinstance(target, Tensor) or target.is_floating_point():
        raise TypeError(f"{fn}: target must be a tensor of class indices")
    loss, lse = cross_entropy(input, target, weight, ignore_index, "none", label_smoothing,
                              z_loss=z_loss, softcap=softcap, logit_scale=logit_scale,
                              logit_offset=logit_offset, return_lse=True)
    with torch.no_grad():
        zt, valid = _target_z(input, target, ignore_index, logit_scale, softcap, logit_offset)
        p = torch.exp(zt - lse)
        flat_p = torch.where(valid, p, torch.full_like(p, float("inf"))).reshape(-1)
        n_valid = valid.sum()
        if flat_p.numel() > 0:
            srt = torch.sort(flat_p).values
            k = torch.clamp(torch.minimum(n_valid - 1, torch.tensor(min_kept, device=n_valid.device)), min=0)
            min_value = srt.gather(0, k.reshape(1)).reshape(())
            thr = min_value if thresh is None else torch.clamp(min_value, min=float(thresh))
            keep = valid & (p < thr)
        else:
            keep = valid
        keep_f = keep.to(loss.dtype)
    kept = loss * keep_f
    if reduction == "none":
        return kept
    total = kept.sum()
    if reduction == "sum":
        return total
    return total / keep_f.sum()


class OhemCrossEntropyLoss(torch.nn.Module):
    """Module form of fusedloss.ohem_cross_entropy: forward(logits, target) -> loss.

    thresh (default 0.7; None: exactly the min_kept hardest), min_kept (default 100000), weight
    (a (C,) buffer), ignore_index (default -100; segmentation codebases use 255), reduction
    ('mean' over the kept positions, 'sum', 'none'), label_smoothing."""

    def __init__(self, thresh=0.7, min_kept: int = 100000, weight=None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0):
        super().__init__()
        _check(f"fusedloss.{type(self).__name__}", thresh, min_kept, reduction)
        self.thresh = None if thresh is None else float(thresh)
        self.min_kept = int(min_kept)
        self.ignore_index = int(ignore_index)
        self.reduction = reduction
        self.label_smoothing = float(label_smoothing)
        self.register_buffer("weight", weight)

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return ohem_cross_entropy(logits, target, self.thresh, self.min_kept, self.weight,
                                  self.ignore_index, self.reduction, self.label_smoothing)

    def extra_repr(self) -> str:
        return (f"thresh={self.thresh}, min_kept={self.min_kept}, ignore_index={self.ignore_index}, "
                f"reduction={self.reduction!r}")
