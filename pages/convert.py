"""Convert: bring a research checkpoint into the speculators format; detect, map keys, convert, validate, download."""

from pathlib import Path

import streamlit as st

from ui import convert as conv
from ui import report, resources, state
from ui.cli import show_cli
from ui.errors import guard
from ui.jobs import argv_value, launch, watch_jobs

ss = st.session_state

st.title("Convert")
into_tab, gguf_tab = st.tabs(["Into the speculators format", "To GGUF for llama.cpp"])


def into_speculators() -> None:
    """A research checkpoint in: detect, map keys, convert, validate, download."""
    st.caption("Drop a draft checkpoint (config.json + .safetensors, or a zip) or give its path. The page detects "
               "its format, shows how its tensors map to the speculators layout, converts it and validates the "
               "result.")
    src = None
    c1, c2 = st.columns(2, gap="large")
    with c1:
        uploads = st.file_uploader("Checkpoint files", type=["json", "safetensors", "zip"], accept_multiple_files=True,
                                   key="convert_upload", help="config.json and the .safetensors file(s), or one .zip. "
                                   "Pickled .bin/.pt weights are not accepted here (unpickling can run code); "
                                   "convert them with the CLI's --allow-pickle if you trust them.")
        if uploads:
            with guard("Reading the upload"):
                ids = tuple(u.file_id for u in uploads)  # staged (and unzipped) once per upload, not on every rerun
                staged = ss.get("convert_staged")
                if not staged or staged[0] != ids or not conv.still_staged(staged[1]):
                    ss["convert_staged"] = (ids, str(conv.stage((u.name, u.getvalue()) for u in uploads)))
                src = ss["convert_staged"][1]
    with c2:
        path = st.text_input("…or a local folder / .zip path", key="convert_path", persist_state="session",
                             placeholder="/path/to/checkpoint").strip()
        if path and not uploads:
            with guard("Opening the checkpoint"):
                src = str(conv.resolve_input(path))

    if not src:
        st.info("Upload a checkpoint or give a path to start.", icon=":material/upload_file:")
        show_cli(["validate", "/path/to/draft"])
        return

    det = None
    with guard("Detecting the format"):
        det = conv.detect(src)
    if det is None:
        return

    st.subheader("Detected format", anchor=False)
    if det.format != conv.SPECULATORS:
        choices = conv.format_choices()  # the engine's registered converters
        if ss.get("convert_format_for") != det.folder:  # another checkpoint: start from its own detection
            ss.pop("convert_format", None)
            ss["convert_format_for"] = det.folder
        chosen = st.selectbox("Source layout", choices,
                              index=choices.index(det.format) if det.format in choices else None,
                              format_func=conv.format_title, key="convert_format",
                              placeholder="not one of the converters' layouts: pick one if you know it",
                              help="Detected from config.json and the tensor names; pick another registered layout if "
                              "the detection is wrong (the CLI's --format).")
        if chosen and chosen != det.format:
            with guard("Reading it as the chosen layout"):
                det = conv.detect(src, fmt=chosen)
    colour = "green" if det.format == conv.SPECULATORS else "blue" if conv.convertible(det) else \
        "red" if det.kind == "not-convertible" else "gray"
    st.badge(det.title, color=colour, icon=":material/fingerprint:")
    st.caption(f"Folder: `{det.folder}`" + (f" · read as your choice; detected: {det.detected}"
                                             if det.format != det.detected else ""))
    st.json(det.facts)
    for note in det.notes:
        st.markdown(f"- {note}")
    with st.expander(f"Key mapping table ({len(det.mapping)} tensors)", expanded=det.format != "speculators"):
        st.dataframe(det.mapping, hide_index=True, width="stretch")

    st.subheader("Convert", anchor=False)
    result_dir = None
    if det.format == conv.SPECULATORS:
        st.success("Already in the speculators format: nothing to convert. Validate it and download it below.",
                   icon=":material/task_alt:")
        result_dir = det.folder
    elif conv.convertible(det):
        hub = resources.target_ref(state.active_target()).hub_id
        c1, c2, c3 = st.columns(3)
        out = c1.text_input("Output folder", conv.default_out(det.folder), key="convert_out")
        verifier = c2.text_input("Verifier (target hub id)", hub or "", key="convert_verifier",
                                 help="Written to speculators_config.verifier.name_or_path; `vllm serve <draft>` "
                                 "serves this model as the target.")
        aux = c3.text_input("Aux layer ids (optional)", "", key="convert_aux", placeholder="e.g. 2, 15, 27",
                            help="When the source does not record them; default: the converter's choice (see notes).")
        mask = None
        if "mask_token_id" in det.options:
            mask_text = c3.text_input("Mask token id (optional)", "", key="convert_mask", placeholder="e.g. 151669",
                                      help=conv.option_help("mask_token_id") + " Default: what the source records.")
            with guard("Reading the mask token id"):
                mask = conv.parse_token_id(mask_text)
        overwrite = c1.checkbox("Replace the output folder even if it holds other files", False,
                                key="convert_overwrite", help="An existing folder is replaced only when it is "
                                "empty or a draft the workbench wrote. Tick this to replace any folder: everything "
                                "in it is deleted.")
        argv = conv.convert_argv(det.folder, out, verifier.strip() or None, aux.replace(" ", "") or None, overwrite,
                                 fmt=det.format if det.format != det.detected else None, mask_token_id=mask)
        with st.expander("Dry run: the resulting config.json (nothing is written)"):
            if st.button("Run the dry run", key="convert_dry", icon=":material/preview:"):
                with guard("Dry run"):
                    result = conv.dry_run(det, verifier.strip() or None, aux.replace(" ", "") or None, mask)
                    for problem in result["problems"]:
                        st.error(problem)
                    if not result["problems"]:
                        st.success("Every tensor maps; the conversion will write this config.", icon=":material/check:")
                    for name, why in result["defaulted"].items():  # said before anything is written; changeable above
                        st.warning(f"**{name.replace('_', ' ')} from a default:** {why} Change them in "
                                   "*Aux layer ids* above before converting." if name == "aux_layer_ids" else
                                   f"**{name.replace('_', ' ')} from a default:** {why}", icon=":material/rule:")
                    st.json(result["config"], expanded=2)  # open: the config is what the dry run is for
            show_cli(argv[:1] + argv[1:2] + ["--dry-run"] + argv[2:], label="The dry-run command")
        if st.button("Convert", type="primary", key="convert_go", icon=":material/transform:"):
            job = launch(argv, kind="convert")
            if job:
                ss["convert_job"] = job.id
        show_cli(argv, label="The conversion command")
    elif det.kind == "not-convertible":
        st.error(f"{det.title}: this cannot be converted into a draft {report.RULES_LABEL} loads. Why: {det.why}.",
                 icon=":material/block:")
        st.info(f"What you can do instead: {det.instead}", icon=":material/lightbulb:")
    else:
        st.error(f"This checkpoint's format is not recognised, so it cannot be converted ({det.why}).",
                 icon=":material/help:")
        st.caption(det.instead)

    picked = watch_jobs(["convert"], "Conversions of this checkpoint", key="convert",
                        where=lambda job: conv.converts(job, det.folder))  # not another checkpoint's failed job
    if picked and picked.status.state == "done":
        result_dir = argv_value(picked, "--out") or result_dir

    if result_dir:
        st.subheader("Validate and download", anchor=False)
        with guard("Validating"):
            report.full(report.validate(result_dir))
        d1, d2 = st.columns(2)
        d1.download_button("Download as zip", lambda: conv.zip_folder(result_dir),
                           file_name=f"{Path(result_dir).name}.zip", mime="application/zip",
                           key="convert_download", icon=":material/folder_zip:", type="primary")
        if d2.button("Use as the active draft", key="convert_use", icon=":material/check:"):
            state.set_draft(result_dir)
            st.toast("Active draft set (see the sidebar)")
        show_cli(["validate", result_dir])


def to_gguf() -> None:
    """The active draft out, as GGUF files llama.cpp runs (llama.cpp's own converter, checked by loading)."""
    st.caption("The active draft as a GGUF file for llama.cpp (llama-server `-md`), made by llama.cpp's own "
               "converter (through a layout it reads where the draft's own differs), then loaded in llama-server "
               "beside the target to draft a few tokens. Optionally the target's GGUF too (its `-m`).")
    draft = state.active_draft()
    if not draft:
        st.info("Pick a draft in the sidebar to export it.", icon=":material/upload_file:")
        return
    problem = None
    with guard("Reading the draft"):
        problem = conv.llamacpp_problem(draft)
    if problem:
        st.error(f"llama.cpp cannot run this draft: {problem}", icon=":material/block:")
        return
    c1, c2, c3 = st.columns(3)
    out = c1.text_input("Draft GGUF file", conv.default_gguf(draft), key="gguf_out")
    draft_type = c2.selectbox("Draft tensor type", ["f32", "bf16", "f16", "q8_0"], key="gguf_draft_type")
    with_target = c3.toggle("Also write the target's GGUF", False, key="gguf_with_target")
    target_out = target_type = None
    if with_target:
        t1, t2 = st.columns(2)
        target_out = t1.text_input("Target GGUF file", str(Path(out).with_name("target.gguf")), key="gguf_target_out")
        target_type = t2.selectbox("Target type", ["f32", "bf16", "f16", "q8_0", "shipped"], key="gguf_target_type",
                                   help="shipped: the built-in target's own quantized GGUF, as its package ships it")
    argv = conv.export_argv(draft, out, draft_type, target_out, target_type)
    if st.button("Export", type="primary", key="gguf_go", icon=":material/output:"):
        job = launch(argv, kind="export")
        if job:
            ss["gguf_job"] = job.id
    show_cli(argv, label="The export command")
    watch_jobs(["export"], "Exports", key="gguf")


with into_tab:
    into_speculators()
with gguf_tab:
    to_gguf()
