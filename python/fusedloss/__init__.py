"""fusedloss — fused loss kernels (C/CUDA, one-header C API) as PyTorch drop-ins.

    import fusedloss
    loss = fusedloss.cross_entropy(logits, target)          # like F.cross_entropy
    criterion = fusedloss.nn.CrossEntropyLoss()             # like torch.nn.CrossEntropyLoss
    h = fusedloss.gelu(x, bias, approximate="tanh")         # like F.gelu(x + bias), dbias fused
    act = fusedloss.nn.BiasGELU(3072)                       # after nn.Linear(768, 3072, bias=False)
    loss = fusedloss.linear_cross_entropy(hidden, lm_head.weight, target)  # lm head + loss, no logits
    loss = fusedloss.vocab_parallel_cross_entropy(shard, target, start, end, group=tp_group)
    fusedloss.patch.apply(model)                            # HF GPT-2 / Llama: fused training loss
    loss = fusedloss.distillation_loss(student_logits, teacher_logits, temperature=2.0, t2_scale=True)
    loss = fusedloss.margin_cross_entropy(cosine, target, s=64.0, m2=0.5)   # ArcFace (also ArcFaceLoss, CosFaceLoss)
    loss = fusedloss.softmax_focal_loss(seg_logits, seg_target, gamma=2.0)  # [N, C, H, W] / [N, C] focal
    loss = fusedloss.lovasz_softmax(seg_probas, seg_target)                 # Lovasz-softmax (mIoU surrogate)
    loss = fusedloss.taylor_cross_entropy(logits, target, order=2)          # Taylor softmax CE (TaylorCrossEntropyLoss)
    loss = fusedloss.large_margin_cross_entropy(logits, target, lam=0.3)    # large-margin softmax CE (LargeMarginSoftmaxLoss)

Layers (STYLE.md section 7): _lib (ctypes, no torch) -> ops (torch.library custom ops) ->
autograd -> functional -> nn -> patch (Hugging Face transformers models; transformers is
imported only when a patch is applied). The library libfusedloss.so is found through
FUSEDLOSS_LIBRARY, the package directory (pip install .), or <repo>/build (make lib;
PYTHONPATH=python).
"""
__version__ = "0.1.0"

from ._lib import FusedLossError, TargetOutOfRangeError, NotBuiltError, cuda_built  # noqa: E402
from . import ops  # noqa: E402,F401  (registers torch.ops.fusedloss.*)
from . import autograd  # noqa: E402,F401
from .ops import check_errors, set_debug, is_debug  # noqa: E402
from .functional import cross_entropy, gelu, linear_cross_entropy  # noqa: E402
from .functional import vocab_parallel_cross_entropy  # noqa: E402
from .zoo import sigmoid_focal_loss, mmcv_sigmoid_focal_loss, binary_cross_entropy_with_logits  # noqa: E402  (header section 9)
from .distill import distillation_loss, kl_div_logits, jsd_logits, DistillationLoss  # noqa: E402  (section 10)
from .softmax_losses import margin_cross_entropy, ArcFaceLoss, CosFaceLoss, CombinedMarginLoss  # noqa: E402  (section 11)
from .softmax_losses import softmax_focal_loss, SoftmaxFocalLoss  # noqa: E402  (section 12)
from .lovasz import lovasz_softmax, LovaszSoftmaxLoss  # noqa: E402  (section 13)
from .taylor import taylor_cross_entropy, TaylorCrossEntropyLoss  # noqa: E402  (section 14)
from .large_margin import large_margin_cross_entropy, LargeMarginSoftmaxLoss  # noqa: E402  (section 15)
from .ohem import ohem_cross_entropy, OhemCrossEntropyLoss  # noqa: E402  (OHEM on section 5)
from .vocab_parallel_linear import vocab_parallel_linear_cross_entropy  # noqa: E402
from .vocab_parallel_margin import vocab_parallel_margin_cross_entropy  # noqa: E402  (section 11 sharded)
from .linear_distill import linear_distillation_loss, LinearDistillationLoss  # noqa: E402  (section 10, no logits)
from . import functional, nn, patch  # noqa: E402,F401

__all__ = ["cross_entropy", "gelu", "linear_cross_entropy", "vocab_parallel_cross_entropy",
           "vocab_parallel_linear_cross_entropy", "nn",
           "patch", "functional", "check_errors", "set_debug", "is_debug", "FusedLossError",
           "TargetOutOfRangeError", "NotBuiltError", "cuda_built", "__version__",
           "sigmoid_focal_loss", "mmcv_sigmoid_focal_loss", "binary_cross_entropy_with_logits",
           "distillation_loss", "kl_div_logits", "jsd_logits", "DistillationLoss",
           "linear_distillation_loss", "LinearDistillationLoss",
           "margin_cross_entropy", "ArcFaceLoss", "CosFaceLoss", "CombinedMarginLoss",
           "softmax_focal_loss", "SoftmaxFocalLoss", "lovasz_softmax", "LovaszSoftmaxLoss",
           "taylor_cross_entropy", "TaylorCrossEntropyLoss",
           "large_margin_cross_entropy", "LargeMarginSoftmaxLoss",
           "ohem_cross_entropy", "OhemCrossEntropyLoss", "vocab_parallel_margin_cross_entropy"]

