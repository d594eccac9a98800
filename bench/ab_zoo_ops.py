#!/usr/bin/env python3
"""ab_zoo_ops.py — run a bench script with the zoo's eager steps forced through the custom ops (the path
before autograd.KeptGradEager), to A/B the host cost of the ops' Python dispatch in the same run:

    python3 bench/ab_zoo_ops.py bench/bench_distill.py --providers fusedloss ...

Every zoo module's `kept_grad_loss` is replaced by one that always calls the op, so the public functions
take torch.ops.fusedloss.*_loss_and_grad (the same C call; the custom op's dispatch and autograd).
"""
import os
import runpy
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import fusedloss  # noqa: E402
from fusedloss import distill, lovasz, softmax_losses, taylor  # noqa: E402

for m in (distill, lovasz, softmax_losses, taylor):
    m.kept_grad_loss = lambda tensors, run, op, *a: op()[0]
print("ab_zoo_ops: the zoo's eager steps go through the custom ops")
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
