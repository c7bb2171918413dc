"""Hostile inputs and faults (issue 18): nothing we did not write is lost, errors say what/where/how to fix.

Every case here is listed in RELIABILITY.md with what the user sees.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.data.options import ExtractOptions, RegenerateOptions
from engine.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]


def _engine(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def _research_src(tmp_path: Path) -> Path:
    """A tiny EAGLE-3 research checkpoint (`midlayer.*` names), as tests/engine/test_convert.py builds them."""
    from safetensors.torch import save_file

    h, nh, nkv, hd, inter, v, vd = 16, 2, 1, 8, 32, 48, 24
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": h, "intermediate_size": inter,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512, "vocab_size": v,
        "draft_vocab_size": vd, "model_type": "llama", "torch_dtype": "float32"}))
    sel = torch.arange(0, v, 2)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[sel] = True
    m = "midlayer."
    state = {"fc.weight": torch.randn(h, 3 * h), "norm.weight": torch.ones(h), "lm_head.weight": torch.randn(vd, h),
             "d2t": sel - torch.arange(vd), "t2d": t2d,
             m + "self_attn.q_proj.weight": torch.randn(nh * hd, 2 * h),
             m + "self_attn.k_proj.weight": torch.randn(nkv * hd, 2 * h),
             m + "self_attn.v_proj.weight": torch.randn(nkv * hd, 2 * h),
             m + "self_attn.o_proj.weight": torch.randn(h, nh * hd),
             m + "mlp.gate_proj.weight": torch.randn(inter, h), m + "mlp.up_proj.weight": torch.randn(inter, h),
             m + "mlp.down_proj.weight": torch.randn(h, inter), m + "input_layernorm.weight": torch.ones(h),
             m + "hidden_norm.weight": torch.ones(h), m + "post_attention_layernorm.weight": torch.ones(h)}
    save_file(state, str(folder / "model.safetensors"))
    return folder


# -- 1. convert --out onto an existing folder --------------------------------------------------------------


def test_convert_refuses_a_folder_it_did_not_write(tmp_path):
    from engine.convert import convert

    src = _research_src(tmp_path)
    out = tmp_path / "my-models"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(WorkbenchError, match="did not write") as info:
        convert(src, out, verifier="org/verifier")
    assert "--overwrite" in info.value.hint and info.value.where == str(out)
    assert (out / "thesis.tex").read_text() == "years of work" and sorted(os.listdir(out)) == ["thesis.tex"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".my-models")]  # no temp folder left behind


def test_convert_replaces_its_own_draft_and_an_empty_folder(tmp_path):
    from engine.convert import convert
    from engine.format.validate import validate_draft

    src = _research_src(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert validate_draft(convert(src, empty, verifier="org/verifier")).ok
    out = convert(src, tmp_path / "out", verifier="org/verifier")
    assert (out / ".workbench-owned.json").is_file()
    convert(src, out, verifier="org/other")  # ours: replaced without --overwrite
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == \
        "org/other"
    (out / "notes.md").write_text("mine")  # a file the user added to our draft makes it theirs too
    with pytest.raises(WorkbenchError, match="notes.md"):
        convert(src, out, verifier="org/verifier")
    assert (out / "notes.md").is_file()


def test_convert_overwrite_replaces_any_folder_but_never_a_file(tmp_path):
    from engine.convert import convert

    src = _research_src(tmp_path)
    out = tmp_path / "other"
    out.mkdir()
    (out / "old.bin").write_bytes(b"x")
    convert(src, out, verifier="org/verifier", overwrite=True)
    assert not (out / "old.bin").exists() and (out / "model.safetensors").is_file()
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    with pytest.raises(WorkbenchError, match="not a folder"):
        convert(src, a_file, verifier="org/verifier", overwrite=True)
    assert a_file.read_text() == "keep"


def test_convert_cli_refuses_then_overwrites(tmp_path):
    src = _research_src(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    run = _engine("convert", str(src), "--out", str(out), "--target", "org/verifier")
    assert run.returncode != 0 and "did not write" in run.stderr and "--overwrite" in run.stderr
    assert "Traceback" not in run.stderr and (out / "keep.txt").read_text() == "keep"
    run = _engine("convert", str(src), "--out", str(out), "--target", "org/verifier", "--overwrite")
    assert run.returncode == 0, run.stderr
    assert not (out / "keep.txt").exists()


def test_convert_page_passes_the_overwrite_checkbox():
    from ui.convert import convert_argv

    assert "--overwrite" not in convert_argv("s", "o", None, None)
    assert convert_argv("s", "o", None, None, overwrite=True)[:4] == ["convert", "s", "--out", "o"]
    assert "--overwrite" in convert_argv("s", "o", None, None, overwrite=True)


def test_a_retrained_draft_from_before_markers_is_still_replaced(tmp_path):
    """`train --out RUN` writes RUN/draft; a RUN from an older version (no marker) must not block retraining."""
    from engine.format.checkpoint import save_checkpoint

    run = tmp_path / "run"
    (run / "draft").mkdir(parents=True)
    (run / ".workbench.lock").write_text("")
    (run / "draft" / "config.json").write_text("{}")
    (run / "draft" / "model.safetensors").write_bytes(b"")
    save_checkpoint(run / "draft", {"a": 1}, {"w": torch.zeros(2)})
    assert json.loads((run / "draft" / "config.json").read_text()) == {"a": 1}


# -- 6. files we write follow the umask -----------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_checkpoint_files_follow_the_umask(tmp_path, umask, mode):
    from engine.format.checkpoint import save_checkpoint
    from engine.fsutil import atomic_save_safetensors

    old = os.umask(umask)
    try:
        folder = save_checkpoint(tmp_path / "d", {"x": 1}, {"w": torch.zeros(4)})
        sharded = save_checkpoint(tmp_path / "s", {"x": 1}, {"a": torch.zeros(4), "b": torch.zeros(4)},
                                  max_shard_bytes=16)
        lone = atomic_save_safetensors({"w": torch.zeros(1)}, tmp_path / "lone.safetensors")
    finally:
        os.umask(old)
    files = [p for p in (*folder.iterdir(), *sharded.iterdir(), lone) if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files) and len(files) >= 6
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == mode, p
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask


def test_files_written_private_inside_an_atomic_directory_are_made_readable(tmp_path):
    """save_pretrained (targets cache) writes through safetensors too."""
    from safetensors.torch import save_file

    from engine.fsutil import atomic_directory

    old = os.umask(0o022)
    try:
        with atomic_directory(tmp_path / "t") as tmp:
            save_file({"w": torch.zeros(1)}, str(tmp / "model.safetensors"))
            (tmp / "sub").mkdir(mode=0o700)
            os.close(os.open(tmp / "sub" / "secret-looking", os.O_CREAT | os.O_WRONLY, 0o600))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "t" / "model.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "t" / "sub").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "t" / "sub" / "secret-looking").stat().st_mode) == 0o644


def test_a_second_holder_of_an_exclusive_lock_is_told_and_waits_for_the_first(tmp_path):
    """engine.fsutil.exclusive_lock: the vLLM installer and the answers store (two CLIs at once) take turns."""
    import threading

    from engine.fsutil import exclusive_lock

    lock, order, told = tmp_path / "sub" / ".lock", [], threading.Event()

    def second():
        with exclusive_lock(lock, on_wait=told.set):
            order.append("second")

    with exclusive_lock(lock):
        thread = threading.Thread(target=second)
        thread.start()
        assert told.wait(30)  # it found the lock held and said so
        order.append("first")
    thread.join(30)
    assert order == ["first", "second"] and lock.is_file()


# -- 2. the app listens on this machine only -----------------------------------------------------------


def test_app_config_and_make_app_bind_to_localhost():
    import tomllib

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "localhost"
    make = subprocess.run(["make", "-n", "-W", ".venv/.installed", "app"], capture_output=True, text=True, cwd=ROOT)
    line = next(x for x in make.stdout.splitlines() if "streamlit run" in x)
    assert "--server.address localhost" in line, line
    exposed = subprocess.run(["make", "-n", "-W", ".venv/.installed", "app", "ADDRESS=0.0.0.0"], capture_output=True,
                             text=True, cwd=ROOT).stdout
    assert "--server.address 0.0.0.0" in exposed  # exposing it is an explicit choice
    assert "Network access" in (ROOT / "README.md").read_text()


def _listening_addresses(port: int) -> list:
    """Local addresses of the TCP sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    import ipaddress

    found = []
    for name, width in (("tcp", 4), ("tcp6", 16)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] != "0A" or int(hexport, 16) != port:  # 0A = LISTEN
                continue
            raw = bytes.fromhex(addr)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))  # little-endian 32-bit words
            ip = ipaddress.ip_address(raw)
            found.append(getattr(ip, "ipv4_mapped", None) or ip)
    return found


def _non_loopback_address() -> str | None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def test_the_running_app_is_not_reachable_from_the_network(tmp_path):
    """`streamlit run app.py` with the repo's config (no --server.address) listens on loopback only."""
    import socket
    import time
    import urllib.request

    if not Path("/proc/net/tcp").exists():
        pytest.skip("needs Linux /proc/net/tcp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "streamlit.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
                             "--server.fileWatcherType", "none"],
                            cwd=ROOT, env={**os.environ, "WORKBENCH_RUNS": str(tmp_path / "runs")}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("streamlit did not start:\n" + (tmp_path / "streamlit.log").read_text())
            time.sleep(0.3)
        addresses = _listening_addresses(port)
        assert addresses and all(a.is_loopback for a in addresses), addresses
        other = _non_loopback_address()
        if other:
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


# -- 3. regenerate --out onto an unrelated file ------------------------------------------------------------

_CHATS = [{"id": "a", "messages": [{"role": "user", "content": "Hello there?"}]},
          {"id": "b", "messages": [{"role": "user", "content": "One more?"}]}]


@pytest.fixture
def fake_answers(monkeypatch):
    import engine.data.answers.regenerate as rg

    monkeypatch.setattr(rg, "generate_answers", lambda target, histories, **kw: [("ok", 1, True) for _ in histories])


class _Target:
    verifier_name = "org/target"

    class tokenizer:  # noqa: N801 - a stand-in; max_length is not used, so it is never called
        pass


@pytest.mark.parametrize("content", [
    b"my notes, no newline at the end",  # plain text without a trailing newline: was cut to nothing
    b"line one\nline two without newline",  # was cut to "line one\n"
    b'{"id": "x", "messages": [{"role": "user", "content": "hi"}]}',  # an input dataset row, no final newline
    b'{"id": "x", "messages": [{"role": "user", "content": "hi"}]}\n',  # a dataset, not regenerate's rows
    b"\xff\xfe binary\n",
])
def test_regenerate_refuses_a_file_it_did_not_write(tmp_path, fake_answers, content):
    import engine.data.answers.regenerate as rg

    out = tmp_path / "precious.jsonl"
    out.write_bytes(content)
    with pytest.raises(WorkbenchError, match="did not write") as info:
        rg.regenerate(_Target(), _CHATS, RegenerateOptions(out=out), progress=False)
    assert info.value.where == str(out) and "new file" in info.value.hint
    assert out.read_bytes() == content
    with pytest.raises(WorkbenchError, match="did not write"):
        rg.check_output(out)
    with pytest.raises(WorkbenchError, match="did not write"):  # not "being written": the lock was released
        rg.open_output(out)
    assert out.read_bytes() == content


def test_regenerate_still_repairs_and_resumes_its_own_file(tmp_path, fake_answers):
    import engine.data.answers.regenerate as rg

    out = tmp_path / "r.jsonl"
    rg.regenerate(_Target(), _CHATS[:1], RegenerateOptions(out=out), progress=False)
    rg.check_output(out)
    with open(out, "ab") as f:
        f.write(b'{"id": "b", "messages": [{"role": "us')  # a crash in the middle of a write
    summary = rg.regenerate(_Target(), _CHATS, RegenerateOptions(out=out), progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"] and summary.already_done == 1 and summary.written == 1


def test_regenerate_cli_refuses_before_loading_the_target(tmp_path):
    out = tmp_path / "notes.txt"
    out.write_text("keep me")
    run = _engine("regenerate", "--target", str(tmp_path / "no-such-target"), "--dataset", str(tmp_path / "none"),
                  "--out", str(out))
    assert run.returncode != 0 and "did not write" in run.stderr and "Traceback" not in run.stderr
    assert out.read_text() == "keep me"


# -- 4. uploaded zips on the Convert page ---------------------------------------------------------------


def _zip(members: dict[str, bytes], level: int = 1) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture
def uploads(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs" / "uploads"


def test_a_zip_bomb_is_refused_before_anything_is_written(uploads):
    from ui import convert as conv

    bomb = _zip({"config.json": b"{}", "model.safetensors": bytes(80 * 2**20)})  # 80 MiB of zeros in ~80 KiB
    assert len(bomb) < 2**20
    with pytest.raises(WorkbenchError, match="zip bomb") as info:
        conv.stage([("draft.zip", bomb)])
    assert info.value.where == "draft.zip"
    assert not list(uploads.rglob("*.safetensors"))  # nothing unpacked, no temp folder left
    assert not [p for p in uploads.iterdir() if p.name.startswith(".")] if uploads.exists() else True


def test_a_zip_over_the_size_limit_is_refused(uploads, monkeypatch, tmp_path):
    from engine.convert import inputs
    from ui import convert as conv

    monkeypatch.setattr(inputs, "MAX_UNZIPPED_BYTES", 2**20)
    big = _zip({"config.json": b"{}", "model.safetensors": os.urandom(2 * 2**20)})
    with pytest.raises(WorkbenchError, match="more than the 1.0 MiB limit") as info:
        conv.stage([("draft.zip", big)])
    assert "WORKBENCH_MAX_UNZIP_GB" in info.value.hint
    local = tmp_path / "local.zip"
    local.write_bytes(big)
    with pytest.raises(WorkbenchError, match="limit"):  # a local .zip path goes through the same checks
        conv.resolve_input(str(local))
    assert not list(uploads.rglob("*.safetensors"))


def test_an_upload_is_extracted_once_and_stale_ones_are_removed(uploads, monkeypatch):
    import time

    from ui import convert as conv

    data = _zip({"d/config.json": b'{"a": 1}', "d/model.safetensors": b"x"})
    first = conv.stage([("draft.zip", data)])
    assert (first / "config.json").is_file() and first.parent.parent == uploads
    calls = []
    with monkeypatch.context() as m:
        from engine.convert import inputs

        m.setattr(inputs, "extract_zip", lambda *a, **k: calls.append(a))
        assert conv.stage([("draft.zip", data)]) == first and not calls  # a rerun reuses it: nothing re-extracted
    assert conv.still_staged(first)
    from engine.fsutil import PARTIAL_MARKER, write_owner_marker

    old = uploads / "convert-000000000000"  # an earlier staged upload (written with its ownership marker)
    old.mkdir()
    write_owner_marker(old, "upload")
    long_ago = time.time() - conv.STAGED_TTL_S - 60
    os.utime(old, (long_ago, long_ago))
    leftover = uploads / ".convert-111111111111.abc.tmp"  # an extraction killed midway
    leftover.mkdir()
    (leftover / PARTIAL_MARKER).touch()
    os.utime(leftover, (long_ago, long_ago))
    other = conv.stage([("other.zip", _zip({"config.json": b"{}"}))])
    assert not old.exists() and not leftover.exists() and first.exists() and other.exists()
    assert not conv.still_staged(old)


# -- 7. sampling parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value", [("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.5), ("top_p", float("nan")),
                                          ("temperature", -0.1), ("temperature", float("inf")), ("top_k", -1),
                                          ("max_new_tokens", 0)])
def test_bad_sampling_parameters_are_a_clear_error(field, value):
    from engine.generate.sampling import SamplingParams

    with pytest.raises(WorkbenchError, match=f"invalid sampling parameter {field}=") as info:
        SamplingParams(**{field: value})
    assert info.value.hint.startswith(f"{field} must be")


def test_good_sampling_parameters_still_work():
    from engine.generate.sampling import SamplingParams, logits_to_probs

    for kw in ({}, {"temperature": 0.7, "top_p": 1.0, "top_k": 0}, {"temperature": 1, "top_p": 0.01, "top_k": 5}):
        probs = logits_to_probs(torch.randn(10), SamplingParams(**kw))
        assert torch.isfinite(probs).all() and abs(float(probs.sum()) - 1) < 1e-5


def test_the_generate_api_checks_parameters_changed_after_creation(tiny_llama):
    from engine.generate.runner import TargetRunner
    from engine.generate.sampling import SamplingParams
    from engine.generate.speculative import generate

    params = SamplingParams(max_new_tokens=2, temperature=1.0)
    params.top_p = 0.0  # used to divide by zero in top-p and sample garbage
    with pytest.raises(WorkbenchError, match="top_p"):
        list(generate(TargetRunner(tiny_llama, None), [1, 2, 3], params))


@pytest.mark.parametrize("flags", [["--top-p", "0"], ["--temperature", "-1"], ["--top-k", "-3"]])
def test_generate_cli_refuses_bad_sampling_before_loading_anything(tmp_path, flags):
    run = _engine("generate", "hello", "--target", str(tmp_path / "no-such-target"), *flags)
    field = flags[0].removeprefix("--").replace("-", "_")
    assert run.returncode == 2 and f"invalid settings — `{field}`" in run.stderr and "Fix:" in run.stderr
    assert "Traceback" not in run.stderr


# -- 5. the CLI's last line of defence: every error as what / where / how to fix ------------------------------


def _engine_patched(patch: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m engine ARGS` with `patch` (Python) run first: a fault injected where no real one is handy."""
    code = f"import sys\n{patch}\nfrom engine.cli import main\nraise SystemExit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)


def _clear(run: subprocess.CompletedProcess, *fragments: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    last = run.stderr.strip().splitlines()
    assert any(line.startswith("error: ") for line in last) and last[-1].startswith("Fix: "), run.stderr[-2000:]
    for fragment in fragments:
        assert fragment in run.stderr, (fragment, run.stderr[-2000:])


def test_cli_pydantic_validation_error_names_the_field_and_the_file(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("lr: abc\n")
    _clear(_engine("train", "--config", str(cfg)), "invalid settings", "`lr`", str(cfg))
    debug = _engine("train", "--config", str(cfg), "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr and "ValidationError" in debug.stderr
    assert "Traceback" in _engine("--debug", "train", "--config", str(cfg)).stderr  # before or after the command


def test_cli_undecodable_bytes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_bytes(b'{"a": "\xff"}')
    _clear(_engine("convert", str(src), "--out", str(tmp_path / "o")), "not valid UTF-8", str(src / "config.json"),
           "0xff")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x98\x00\x00binary")
    run = _engine("validate", str(weights))  # validate reports it as a finding on config.json (exit code 1)
    assert run.returncode == 1 and "Traceback" not in run.stderr and "not valid UTF-8" in run.stdout


def test_cli_unpickling_refusal(tmp_path):
    import argparse

    from safetensors.torch import load_file

    src = _research_src(tmp_path)

    tensors = load_file(str(src / "model.safetensors"))
    (src / "model.safetensors").unlink()
    torch.save({**tensors, "extra": argparse.Namespace(run="me")}, src / "pytorch_model.bin")
    run = _engine("convert", str(src), "--out", str(tmp_path / "o"), "--target", "org/v", "--allow-pickle")
    _clear(run, "refused to unpickle", "argparse.Namespace", "pytorch_model.bin")
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def broken_drafts(tiny_llama, tmp_path_factory):
    """A tiny draft with a truncated model.safetensors, and one whose fc.weight has the wrong shape."""
    import shutil

    from safetensors.torch import load_file, save_file

    from engine.algos.eagle3.args import Eagle3Args
    from engine.algos.eagle3.io import build_eagle3, save_eagle3

    root = tmp_path_factory.mktemp("broken")
    draft = build_eagle3(tiny_llama, Eagle3Args(draft_vocab_size=128), token_counts=torch.arange(tiny_llama.vocab_size),
                         aux_layer_ids=[1, 2, 3])
    good = save_eagle3(draft, root / "good", dtype=torch.float32)
    truncated, shape = root / "truncated", root / "shape"
    shutil.copytree(good, truncated)
    shutil.copytree(good, shape)
    data = (good / "model.safetensors").read_bytes()
    (truncated / "model.safetensors").write_bytes(data[:-100])
    state = load_file(str(good / "model.safetensors"))
    state["fc.weight"] = torch.zeros(state["fc.weight"].shape[0], state["fc.weight"].shape[1] + 1)
    save_file(state, str(shape / "model.safetensors"))
    return {"truncated": truncated, "shape": shape}


def test_cli_corrupt_safetensors(tiny_targets, broken_drafts):
    run = _engine("generate", "hi", "--target", str(tiny_targets["llama"]), "--draft",
                  str(broken_drafts["truncated"]), "--max-new-tokens", "2")
    _clear(run, "a .safetensors file cannot be read", str(broken_drafts["truncated"] / "model.safetensors"),
           "re-download")


def test_cli_state_dict_that_does_not_fit(tiny_targets, broken_drafts):
    run = _engine("generate", "hi", "--target", str(tiny_targets["llama"]), "--draft", str(broken_drafts["shape"]),
                  "--max-new-tokens", "2")
    _clear(run, "the weights do not fit the model", "fc.weight", "validate")


_FAIL_MKDTEMP = """
import errno, os, tempfile
def fail(*a, dir=None, **k):
    raise OSError(errno.{name}, os.strerror(errno.{name}), dir)
tempfile.mkdtemp = fail
"""


@pytest.mark.parametrize("name, what", [("ENOSPC", "no space left on the disk"), ("EROFS", "read-only"),
                                        ("EACCES", "permission denied"), ("EISDIR", "a folder was given"),
                                        ("ENOENT", "no such file or folder")])
def test_cli_os_errors(tmp_path, name, what):
    src = _research_src(tmp_path)
    run = _engine_patched(_FAIL_MKDTEMP.format(name=name), "convert", str(src), "--out", str(tmp_path / "o"),
                          "--target", "org/v")
    _clear(run, what, str(tmp_path))


def test_cli_disk_full_during_a_checkpoint_write_leaves_nothing_half_written(tmp_path):
    src = _research_src(tmp_path)
    patch = """
import errno, safetensors.torch as st
def full(tensors, filename, metadata=None):
    with open(filename, "wb") as f:
        f.write(b"partial")
    raise OSError(errno.ENOSPC, "No space left on device", filename)
st.save_file = full
"""
    out = tmp_path / "o"
    _clear(_engine_patched(patch, "convert", str(src), "--out", str(out), "--target", "org/v"), "no space left",
           "free disk space")
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no temp folder either


def test_cli_unexpected_errors_are_one_line_with_debug_for_the_traceback(tmp_path):
    patch = "import engine.commands.validate as v\nv.run = lambda args: 1 / 0"
    run = _engine_patched(patch, "validate", str(tmp_path))
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "unexpected ZeroDivisionError" in run.stderr and "--debug" in run.stderr
    debug = _engine_patched(patch, "validate", str(tmp_path), "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr


def test_translator_unit_cases():
    import errno

    from engine.errors import translate

    assert translate(ZeroDivisionError()) is None and translate(KeyError("x")) is None
    err = translate(OSError(errno.ENOSPC, "No space left on device", "/data/out"))
    assert err.where == "/data/out" and "no space" in err.message and err.hint
    err = translate(UnicodeDecodeError("utf-8", b"a\xff", 1, 2, "invalid start byte"))
    assert "0xff at offset 1" in err.message
    same = WorkbenchError("x")
    assert translate(same) is same


# -- drafts load the same everywhere (embed_tokens) ----------------------------------------------------


def test_eagle3_drafts_carry_embed_tokens_unless_opted_out(tiny_llama, tmp_path):
    from engine.algos import ALGOS
    from engine.algos.eagle3.args import Eagle3Args
    from engine.commands.train import add_arguments, train_overrides
    from engine.format.checkpoint import tensor_index
    from engine.format.validate import validate_draft

    field = Eagle3Args.model_fields["save_embeddings"]
    assert field.default is True and "random" in field.description and "speculators 0.9.0" in field.description
    algo = ALGOS.get("eagle3")
    names = {}
    for keep in (True, False):
        draft = algo.build(tiny_llama, Eagle3Args(save_embeddings=keep), aux_layer_ids=[1, 2, 3], token_counts=None,
                           seed=0)
        folder = algo.save(draft, tmp_path / str(keep))
        names[keep] = set(tensor_index(folder))
        warned = [w for w in validate_draft(folder).warnings if w.field == "tensor:embed_tokens.weight"]
        assert bool(warned) is not keep
        assert algo.load(folder, tiny_llama) is not None  # both load in our model
    assert names[True] - names[False] == {"embed_tokens.weight"}
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--data", "x", "--no-save-embeddings"])
    assert train_overrides(args)["save_embeddings"] is False


def test_validate_warns_about_a_draft_without_embed_tokens_and_names_the_repair(tiny_llama, tmp_path):
    """A draft saved without its embedding (as the shipped one was before `engine repair`): validate says what
    speculators 0.9.0 does with it and which command stores it."""
    from engine.algos import ALGOS
    from engine.algos.eagle3.args import Eagle3Args
    from engine.format.validate import validate_draft

    algo = ALGOS.get("eagle3")
    draft = algo.build(tiny_llama, Eagle3Args(save_embeddings=False), aux_layer_ids=[1, 2, 3], token_counts=None,
                       seed=0)
    folder = algo.save(draft, tmp_path / "slim")
    report = validate_draft(folder, check_weights=True)
    assert report.ok, report.errors
    [warning] = [w for w in report.warnings if w.field == "tensor:embed_tokens.weight"]
    assert "random values" in warning.message and "speculators 0.9.0" in warning.message
    assert f"python -m engine repair {folder}" in warning.message


# -- validation does not pass drafts that cannot work ---------------------------------------------------


@pytest.fixture(scope="module")
def good_draft(tiny_llama, tmp_path_factory) -> Path:
    from engine.algos.eagle3.args import Eagle3Args
    from engine.algos.eagle3.io import build_eagle3, save_eagle3

    draft = build_eagle3(tiny_llama, Eagle3Args(draft_vocab_size=128), token_counts=torch.arange(tiny_llama.vocab_size),
                         aux_layer_ids=[1, 2, 3])
    return save_eagle3(draft, tmp_path_factory.mktemp("vd") / "good", dtype=torch.float32)


def _variant(good: Path, dest: Path, *, config=None, tensors=None) -> Path:
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(good, dest)
    if config:
        cfg = json.loads((dest / "config.json").read_text())
        config(cfg)
        (dest / "config.json").write_text(json.dumps(cfg))
    if tensors:
        state = load_file(str(dest / "model.safetensors"))
        tensors(state)
        save_file(state, str(dest / "model.safetensors"))
    return dest


def _k(value):
    return lambda c: c["speculators_config"]["proposal_methods"][0].__setitem__("speculative_tokens", value)


K = "speculators_config.proposal_methods[0].speculative_tokens"


@pytest.mark.parametrize("name, change, field, fragment", [
    ("int-weights", dict(tensors=lambda s: s.__setitem__("fc.weight", s["fc.weight"].to(torch.int32))),
     "tensor:fc.weight", "dtype I32 where a floating-point tensor belongs"),
    ("float-d2t", dict(tensors=lambda s: s.__setitem__("d2t", s["d2t"].float())), "tensor:d2t", "expected I64"),
    ("nan", dict(tensors=lambda s: s["layers.0.self_attn.q_proj.weight"].__setitem__((0, 0), float("nan"))),
     "tensor:layers.0.self_attn.q_proj.weight", "NaN or inf"),
    ("inf", dict(tensors=lambda s: s["lm_head.weight"].__setitem__((1, 1), float("inf"))), "tensor:lm_head.weight",
     "NaN or inf"),
    ("k-huge", dict(config=_k(100_000)), K, "at most 64"),
    ("k-string", dict(config=_k("3")), K, 'got "3" (a JSON string)'),
    ("k-float", dict(config=_k(2.5)), K, "must be a positive integer, got 2.5"),
    ("k-bool", dict(config=_k(True)), K, "got true"),
    ("vocab-string", dict(config=lambda c: c.__setitem__("draft_vocab_size", "128")), "draft_vocab_size",
     'must be an integer, got "128" (a JSON string)'),
    ("bool-string", dict(config=lambda c: c.__setitem__("norm_before_residual", "false")), "norm_before_residual",
     'the string "false" is true'),
    ("aux-strings", dict(config=lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", ["1", "2", "3"])),
     "eagle_aux_hidden_state_layer_ids", "must be an integer"),
])
def test_validation_refuses_drafts_that_cannot_work(good_draft, tmp_path, name, change, field, fragment):
    from engine.format.validate import validate_draft

    report = validate_draft(_variant(good_draft, tmp_path / name, **change))
    assert not report.ok
    hits = [e for e in report.errors if e.field == field]
    assert hits and fragment in hits[0].message, [(e.field, e.message) for e in report.errors]
    # the hint names the field that is wrong, and only that one
    assert {e.field for e in report.errors} == {field}, [(e.field, e.message) for e in report.errors]


def test_the_good_draft_passes_and_int_buffers_are_not_flagged(good_draft):
    from engine.format.validate import validate_draft

    report = validate_draft(good_draft)
    assert report.ok, [(e.field, e.message) for e in report.errors]


def test_a_shard_index_pointing_outside_the_draft_folder_is_refused(good_draft, tmp_path):
    from safetensors.torch import load_file

    from engine.format.checkpoint import load_state_dict
    from engine.format.validate import validate_draft

    names = list(load_file(str(good_draft / "model.safetensors")))

    def outside(state):
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "bad" / "model.safetensors").rename(tmp_path / "elsewhere" / "w.safetensors")
        index = {"metadata": {}, "weight_map": {n: "../elsewhere/w.safetensors" for n in names}}
        (tmp_path / "bad" / "model.safetensors.index.json").write_text(json.dumps(index))

    folder = _variant(good_draft, tmp_path / "bad")
    outside(None)
    report = validate_draft(folder)
    assert [e.field for e in report.errors] == ["model.safetensors.index.json"]
    assert "outside the draft folder" in report.errors[0].message and "../elsewhere" in report.errors[0].message
    with pytest.raises(WorkbenchError, match="outside the draft folder"):
        load_state_dict(folder)  # loading refuses it too, not only validate
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = {n: str(tmp_path / "elsewhere" / "w.safetensors") for n in names}  # absolute
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "outside the draft folder" in validate_draft(folder).errors[0].message


def test_a_draft_whose_verifier_is_not_the_chosen_target(good_draft, tiny_targets):
    from engine.format.validate import validate_draft

    assert validate_draft(good_draft, target=str(tiny_targets["llama"])).ok  # its own verifier
    other = validate_draft(good_draft, target=str(tiny_targets["qwen3"]))
    assert not other.ok and {e.field for e in other.errors} == {"target"}
    assert "trained for" in other.errors[0].message and str(tiny_targets["qwen3"]) in other.errors[0].message
    run = _engine("validate", str(good_draft), "--target", str(tiny_targets["qwen3"]))
    assert run.returncode == 1 and "target: the draft was trained for" in run.stdout
    # a target of other shapes: the mismatch is the target's, not a config field to edit
    builtin = validate_draft(good_draft, verifier_config={"hidden_size": 576, "vocab_size": 49152,
                                                          "num_hidden_layers": 30}, target="smollm2-135m-instruct")
    assert {e.field for e in builtin.errors} == {"target"}
    assert not any("set target_hidden_size" in e.message for e in builtin.errors)


# -- datasets: one bad row is one skipped row -----------------------------------------------------------


def _chat(i: int) -> dict:
    return {"id": f"c{i}", "messages": [{"role": "user", "content": f"question {i}"},
                                        {"role": "assistant", "content": f"answer {i}"}]}


def test_an_undecodable_byte_skips_one_row_with_its_line_number(tmp_path):
    from engine.data.render.datasets import load_conversations

    lines = [json.dumps(_chat(i)).encode() for i in range(6)]
    lines[2] = lines[2].replace(b"question 2", b"question \xff\xfe 2")  # not UTF-8
    lines[4] = b'{"id": "c4", "messages": [oops'  # invalid JSON, for comparison
    (tmp_path / "d.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    rows, summary = load_conversations(str(tmp_path / "d.jsonl"), split="all")
    assert [r["id"] for r in rows] == ["c0", "c1", "c3", "c5"]
    assert summary.skipped == {"undecodable bytes (not UTF-8)": 1, "invalid JSON line": 1}
    assert summary.bad_lines == {"undecodable bytes (not UTF-8)": [3], "invalid JSON line": [5]}
    assert "undecodable bytes (not UTF-8): line 3" in summary.format()
    # a JSON array: the record holding the bytes is skipped, the rest kept
    text = json.dumps([_chat(i) for i in range(4)], indent=1).encode().replace(b"answer 1", b"answer \xc3\x28 1")
    (tmp_path / "d.json").write_bytes(text)
    rows, summary = load_conversations(str(tmp_path / "d.json"), split="all")
    assert [r["id"] for r in rows] == ["c0", "c2", "c3"]
    [line] = summary.bad_lines["undecodable bytes (not UTF-8)"]
    assert text.splitlines()[line - 1].strip() == b"{"  # the line where that record starts


def test_prepare_reports_undecodable_rows_instead_of_failing(tiny_targets, tmp_path):
    lines = [json.dumps(_chat(i)).encode() for i in range(3)]
    lines[1] = b'{"id": "c1", "messages": "\x80"}'
    (tmp_path / "d.jsonl").write_bytes(b"\n".join(lines))
    run = _engine("prepare", "--dataset", str(tmp_path / "d.jsonl"), "--target", str(tiny_targets["llama"]),
                  "--json", "--split", "all")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["rows_kept"] == 2 and summary["bad_lines"] == {"undecodable bytes (not UTF-8)": [2]}


def test_regenerate_keeps_prompt_only_rows(tiny_targets, tmp_path, monkeypatch):
    from engine.data.answers import regenerate as rg
    from engine.data.answers.dataset import regenerate_dataset
    from engine.data.render.datasets import load_conversations

    rows = [{"id": "p1", "messages": [{"role": "user", "content": "hi"}]},
            {"id": "p2", "prompt": "tell me a joke"},
            {"id": "p3", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "x"}]},
            _chat(4)]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, summary = load_conversations(str(tmp_path / "prompts.jsonl"), split="all")
    assert [r["id"] for r in kept] == ["c4"] and summary.skipped["no assistant turn"] == 3  # training: dropped
    monkeypatch.setattr(rg, "generate_answers", lambda target, histories, **kw: [("sure", 1, True)] * len(histories))
    result = regenerate_dataset(RegenerateOptions(out=str(tmp_path / "out.jsonl"),
                                                  dataset=str(tmp_path / "prompts.jsonl"),
                                                  target=str(tiny_targets["llama"]), split="all", max_new_tokens=2))
    written = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert result.written == 4 and [r["id"] for r in written] == ["p1", "p2", "p3", "c4"]
    assert written[1]["messages"] == [{"role": "user", "content": "tell me a joke"},
                                      {"role": "assistant", "content": "sure"}]


# -- jobs and training ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_hs(tiny_targets, tmp_path_factory) -> Path:
    from engine.data.extract.dataset import extract_dataset

    out = tmp_path_factory.mktemp("hs") / "llama"
    extract_dataset(ExtractOptions(target=str(tiny_targets["llama"]), dataset="sharegpt", out=out, algo="eagle3",
                                   max_samples=12, max_length=96, dtype="fp32"), progress=False)
    return out


def _train_cfg(target, data, out, **kw):
    from engine.train.config import TrainConfig

    base = dict(target=str(target), data=str(data), out=str(out), tokens_per_batch=192, max_length=96,
                draft_vocab_size=128, warmup_steps=1, lr=3e-3, val_every=1000, checkpoint_every=2,
                val_fraction=0.2, seed=0, max_steps=4)
    return TrainConfig(**{**base, **kw})


def test_a_refused_second_train_does_not_touch_the_running_jobs_files(tiny_targets, tiny_hs, tmp_path):
    from engine.fsutil import claim_names
    from engine.jobs import DirLock
    from engine.train.trainer import JOB_FILES, Trainer

    out = tmp_path / "run"
    claim_names(out, JOB_FILES, kind="train")  # as the first job did before writing its files
    (out / "config.yaml").write_text("the first job's config\n")
    (out / "metrics.jsonl").write_text('{"split": "train", "step": 1}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with DirLock(out, "the first job"):
        with pytest.raises(WorkbenchError, match="in use by another job"):
            Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out)).run()
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".workbench.lock"} == \
            {k: v for k, v in before.items()}


def test_resume_refuses_changed_model_flags_and_records_harmless_ones(tiny_targets, tiny_hs, tmp_path):
    from engine.train.trainer import Trainer

    out = tmp_path / "run"
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=2)).run()
    config_before = (out / "config.yaml").read_bytes()
    for change, named in ((dict(num_layers=2), "num_layers: 1 -> 2"), (dict(lr=1e-2), "lr: 0.003 -> 0.01"),
                          (dict(draft_vocab_size=64), "draft_vocab_size: 128 -> 64")):
        with pytest.raises(WorkbenchError, match="trained with other settings") as err:
            Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=2, **change)).run()
        assert named in err.value.message and "new --out folder" in err.value.hint
        assert (out / "config.yaml").read_bytes() == config_before  # a refused resume writes nothing
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=3, epochs=2)).run()  # harmless: allowed
    [row] = [json.loads(line) for line in (out / "resumes.jsonl").read_text().splitlines()]
    assert row["step"] == 2 and row["changed"] == {"max_steps": {"before": 2, "now": 3},
                                                   "epochs": {"before": 1, "now": 2}}
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == [1, 2, 3]


def test_a_run_started_with_its_target_named_resumes_without_it(tiny_targets, tiny_hs, tmp_path):
    """Runs recorded the target by name before `train --data` followed the data's manifest; resuming one without
    --target follows the same data, so it is no changed setting (a different --target still is)."""
    from engine.train.trainer import Trainer

    out = tmp_path / "run"
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=2)).run()
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=3).model_copy(update={"target": None})).run()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == [1, 2, 3]


def test_metrics_after_a_hard_kill_are_valid_jsonl_without_duplicate_steps(tiny_targets, tiny_hs, tmp_path):
    """The state a SIGKILL leaves: rows logged after the last checkpoint, half a line, a temp checkpoint folder."""
    from engine.train.trainer import Trainer

    out = tmp_path / "run"
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=2)).run()  # checkpoint at step 2
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"split": "train", "step": 3, "loss": 1.0}) + "\n")  # logged, then killed before step 4
        f.write('{"split": "train", "step": 4, "lo')  # killed in the middle of a write
    from engine.fsutil import PARTIAL_MARKER, write_owner_marker

    temp = out / "checkpoints" / ".step_0000004.abc123.tmp"  # as atomic_directory leaves it when killed
    temp.mkdir()
    (temp / PARTIAL_MARKER).touch()
    (temp / "model.safetensors").write_bytes(b"partial")
    (out / ".draft.old-1234abcd").mkdir()  # a finished draft moved aside, with its ownership marker
    write_owner_marker(out / ".draft.old-1234abcd", "draft")
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=4)).run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]  # every line parses
    train_steps = [r["step"] for r in rows if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4]
    assert not temp.exists() and not (out / ".draft.old-1234abcd").exists()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_0000002", "step_0000004"]


def test_the_disk_precheck_names_the_real_requirement_with_its_margin(tmp_path, monkeypatch):
    import shutil as sh

    from engine.data.extract import run as extraction_run

    monkeypatch.setattr(sh, "disk_usage", lambda p: sh._ntuple_diskusage(10 * 2**30, 9 * 2**30, 2**30))
    with pytest.raises(WorkbenchError) as err:
        extraction_run.check_disk(tmp_path, 2**30)  # 1 GiB of samples: needs 1.1 GiB with the margin
    assert "needs 1.1 GiB free" in err.value.message and "plus 5% and 64 MiB" in err.value.message
    assert "only 1.0 GiB is free" in err.value.message
    extraction_run.check_disk(tmp_path, 900 * 2**20)  # fits with its margin


def test_a_full_disk_during_a_training_checkpoint_keeps_the_previous_one(tiny_targets, tiny_hs, tmp_path,
                                                                         monkeypatch):
    import errno

    from safetensors.torch import load_file

    from engine.errors import translate
    from engine.format import checkpoint
    from engine.train.trainer import Trainer

    out = tmp_path / "run"
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=2)).run()
    good = load_file(str(out / "checkpoints" / "step_0000002" / "model.safetensors"))

    def full(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint, "atomic_save_safetensors", full)
    with pytest.raises(OSError) as err:
        Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=4)).run()
    message = translate(err.value)
    assert "no space left" in message.message and message.hint  # what the CLI prints
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_0000002"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_0000002"]  # no temp folder
    again = load_file(str(out / "checkpoints" / "step_0000002" / "model.safetensors"))
    assert all(torch.equal(good[k], again[k]) for k in good)
    monkeypatch.undo()
    Trainer(_train_cfg(tiny_targets["llama"], tiny_hs, out, max_steps=4)).run()  # resumes once there is room
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_0000004"


# -- deleting only what the workbench wrote ---------------------------------------------------------------


def test_cleanups_never_delete_a_users_folders(tmp_path, monkeypatch):
    """Checkpoint pruning, temp-folder cleanup and upload pruning look like ours by name only; they must not
    delete a folder of the user's with such a name (no ownership or partial marker, or files added to it)."""
    import time

    from engine.fsutil import atomic_directory, remove_ours
    from engine.train.checkpoints import prune_checkpoints
    from engine.train.resume import clean_temp_checkpoints
    from ui import convert as conv

    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):  # ours, written as the trainer writes checkpoints
        with atomic_directory(ckpts / f"step_{step:07d}", owner="checkpoint") as tmp:
            (tmp / "model.safetensors").write_bytes(b"w")
    users = ckpts / "step_0000000"  # the user's own folder that happens to match the pattern
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    (ckpts / "step_0000001" / "added.txt").write_text("mine too")  # a user file added to one of ours
    legacy = ckpts / "step_0000001_legacy"  # written before markers existed: only the trainer's files
    (legacy / "trainer_state").mkdir(parents=True)
    (legacy / "trainer_state" / "state.json").write_text("{}")
    (legacy / "model.safetensors").write_bytes(b"w")
    removed = prune_checkpoints(ckpts, keep=1)
    assert [p.name for p in removed] == ["step_0000001_legacy", "step_0000002"]
    assert (users / "notes.txt").is_file() and (ckpts / "step_0000001" / "added.txt").is_file()

    lookalike = ckpts / ".step_0000009.mine.tmp"
    lookalike.mkdir()
    (lookalike / "data.bin").write_bytes(b"x")
    (tmp_path / "run" / ".draft.old-backup").mkdir()
    assert clean_temp_checkpoints(tmp_path / "run") == []
    assert (lookalike / "data.bin").is_file() and (tmp_path / "run" / ".draft.old-backup").is_dir()

    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    uploads = conv.uploads_dir()
    theirs = uploads / "convert-123456789abc"
    theirs.mkdir(parents=True)
    (theirs / "config.json").write_text("{}")
    long_ago = time.time() - conv.STAGED_TTL_S - 60
    os.utime(theirs, (long_ago, long_ago))
    assert conv.prune_staged(now=time.time()) == [] and (theirs / "config.json").is_file()
    assert not remove_ours(tmp_path / "run" / "checkpoints" / "step_0000000")
