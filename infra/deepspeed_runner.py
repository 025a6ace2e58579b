"""DeepSpeed's launcher, the `deepspeed` script's `deepspeed.launcher.runner.main`, started with MLflow kept out.

    python -m infra.deepspeed_runner --num_gpus 2 --master_port 29500 --module tasks.training.loop --job job.json

The same runner with the same flags as `deepspeed ...`: it reads the hostfile, starts DeepSpeed's per-node launcher
and waits for the ranks. Importing DeepSpeed imports its autotuner, which imports MLflow, and the runner never uses
either: about 2.5 of the runner's 6 s of start-up on a 2-core CPU, paid by every launch. `import_deepspeed` does the
same for a rank.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_deepspeed(module: str = "deepspeed") -> ModuleType:
    """`module` (DeepSpeed or one of its modules), imported with MLflow kept out; `import mlflow` works again after.

    Where DeepSpeed or MLflow is already imported there is nothing to save, and this is a plain import."""
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        return importlib.import_module(module)
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError meanwhile
    try:
        return importlib.import_module(module)
    finally:
        del sys.modules["mlflow"]


def main() -> int | None:
    return import_deepspeed("deepspeed.launcher.runner").main()


if __name__ == "__main__":
    sys.exit(main())
