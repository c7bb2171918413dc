"""`python -m engine` that stops dead in the middle of a write, for tests/engine/test_faults.py.

$DIE_ON = "safetensors:N[:SUBSTRING]" or "rows:N": the N-th safetensors file (whose path contains SUBSTRING, if
given) or the N-th batch of regenerated rows is written half-way, flushed to disk, `$DIE_FLAG` is created, and the
process sleeps until the test SIGKILLs it. This is the state a power cut or an OOM kill leaves in the worst moment.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

KIND, _, REST = os.environ["DIE_ON"].partition(":")
NTH, _, PATH_HAS = REST.partition(":")
NTH = int(NTH)
FLAG = Path(os.environ["DIE_FLAG"])
_calls = 0


def _due(path: str = "") -> bool:
    global _calls
    if PATH_HAS and PATH_HAS not in path:
        return False
    _calls += 1
    return _calls == NTH


def _die_after(f, data: bytes) -> None:
    f.write(data[: len(data) // 2])
    f.flush()
    os.fsync(f.fileno())
    FLAG.write_text(str(os.getpid()))
    time.sleep(120)  # killed long before; never outlive a failed test
    os._exit(3)


if KIND == "safetensors":
    import safetensors.torch

    _save_file = safetensors.torch.save_file

    def save_file(tensors, filename, metadata=None):
        if not _due(str(filename)):
            return _save_file(tensors, filename, metadata=metadata)
        with open(filename, "wb") as f:
            _die_after(f, safetensors.torch.save(tensors, metadata=metadata))

    safetensors.torch.save_file = save_file
elif KIND == "rows":
    import json

    from engine.data.answers import regenerate

    _append_rows = regenerate.append_rows

    def append_rows(f, rows):
        if not _due():
            return _append_rows(f, rows)
        _die_after(f, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8"))

    regenerate.append_rows = append_rows
else:
    raise SystemExit(f"DIE_ON: unknown kind {KIND!r}")

if __name__ == "__main__":
    from engine.cli import main

    sys.exit(main(sys.argv[1:]))
