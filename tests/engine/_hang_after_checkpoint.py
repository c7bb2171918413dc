"""`python -m engine` with one change, for tests/engine/test_distributed.py: once a periodic checkpoint at or
after step $HANG_AFTER_STEP is written, the next micro-batch never finishes (the test then kills the run)."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engine.train.trainer import Trainer  # noqa: E402

AFTER = int(os.environ["HANG_AFTER_STEP"])
_save, _micro = Trainer.save, Trainer._micro_step


def save(self, reason):
    out = _save(self, reason)
    if reason == "periodic" and self.step >= AFTER:
        self._hang = True
    return out


def micro_step(self, batch):
    if getattr(self, "_hang", False):
        time.sleep(120)  # killed long before; never outlive a failed test
        os._exit(3)
    return _micro(self, batch)


Trainer.save, Trainer._micro_step = save, micro_step

if __name__ == "__main__":
    from engine.cli import main

    sys.exit(main(sys.argv[1:]))
