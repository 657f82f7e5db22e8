"""Time pure computation: SGD steps of the digits CNN on random data (batch 16), torch threads = 1.

scripts/test-arm64.sh runs it natively and on the emulated device, to set the round-time ratio
beside qemu's slowdown of computation. Prints JSON.
"""

import json
import platform
import time

import torch

from clusterfed.models import build_model

torch.set_num_threads(1)
model = build_model("digits-cnn", "digits", (1, 8, 8), 10, seed=0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
generator = torch.Generator().manual_seed(0)
x, y = torch.randn(16, 1, 8, 8, generator=generator), torch.randint(0, 10, (16,), generator=generator)
loss_fn = torch.nn.CrossEntropyLoss()


def steps(n):
    for _ in range(n):
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()


steps(3)  # warm-up
n = 40
start = time.perf_counter()
steps(n)
seconds = time.perf_counter() - start
print(json.dumps({"machine": platform.machine(), "torch": torch.__version__, "steps": n,
                  "seconds": round(seconds, 4), "ms_per_step": round(1000 * seconds / n, 3)}))
