"""Config builder: a visual form and a JSON editor on the same speculators config, validated on every edit."""

import streamlit as st

from ui import builder, report, resources, state
from ui.cli import show_cli
from ui.errors import callback, guard

st.title("Config builder")
st.caption("Edit a speculators `config.json` in the form or as JSON: both stay in sync, and every edit is checked "
           f"against {report.RULES_LABEL}'s own rules and the workbench's extra checks, field by field "
           f"(`python -m engine serve` runs {report.CPU_BUILD_LABEL} on a CPU).")

ss = st.session_state
target = state.active_target()


def _new(algorithm: str) -> None:
    ref = resources.target_ref(state.active_target())
    cfg = builder.template(algorithm, ref.path, ref.hub_id or ref.path)
    builder.load(cfg)
    if "mask_token_id" in cfg:
        ss[builder.MASK_HINT] = builder.suggest_mask_token(ref.path)[1]


def _from_draft(path: str) -> None:
    from ui.catalog import config_json

    builder.load(config_json(path), from_draft=True)


def _from_upload() -> None:
    upload = ss.get("builder_upload")
    if upload is not None:
        builder.load(builder.parse_upload(upload.name, upload.getvalue()), from_draft=True)


if builder.CFG not in ss:
    with guard("Preparing a starting config"):
        draft = state.active_draft()
        if draft:
            _from_draft(draft)
        else:
            _new(builder.algorithms()[0])
if builder.CFG not in ss:
    st.stop()

# -- start from -------------------------------------------------------------------------------------
with st.expander("Start from…", icon=":material/note_add:", expanded=False):
    c1, c2, c3 = st.columns(3)
    with c1:
        algorithm = st.selectbox("Algorithm", builder.algorithms(), key="builder_new_algo")
        st.button("New config for the active target", key="builder_new", icon=":material/add:",
                  on_click=callback("Building a config", _new, algorithm))
    with c2:
        draft = state.active_draft()
        st.caption(f"Active draft: `{state.short(draft)}`")
        st.button("Load the active draft's config", key="builder_from_draft", disabled=not draft,
                  icon=":material/download:", on_click=callback("Loading the draft's config", _from_draft, draft))
    with c3:
        st.file_uploader("Upload a config.json", type=["json"], key="builder_upload")
        st.button("Load the uploaded file", key="builder_from_upload", icon=":material/upload:",
                  on_click=callback("Reading the upload", _from_upload))

cfg = ss[builder.CFG]
if ss.get(builder.MASK_HINT) and "mask_token_id" in cfg:
    st.caption(f":material/lightbulb: Mask token suggested: {ss[builder.MASK_HINT]}.")
if builder.k_hint(cfg):
    st.warning(builder.k_hint(cfg), icon=":material/speed:")
with guard("Validating"):
    import copy

    rep = report.validate(copy.deepcopy(cfg))
    report.verdicts(rep)
    by_field = rep.issues_by_field()
    groups = builder.fields_for(cfg.get("speculators_model_type"))
    paths = {f.path for fields in groups.values() for f in fields}

    form_col, json_col = st.columns(2, gap="large")
    with form_col:
        st.subheader("Form", anchor=False)
        for title, fields in groups.items():
            st.markdown(f"**{title}**")
            cols = st.columns(2)
            for i, field in enumerate(fields):
                with cols[i % 2]:
                    builder.widget(field, by_field.get(field.path, []))
    with json_col:
        st.subheader("JSON", anchor=False)
        if builder.TEXT not in ss:
            ss[builder.TEXT] = builder.dump(cfg)
        st.text_area("config.json", key=builder.TEXT, height=760, on_change=builder.on_json_edit,
                     label_visibility="collapsed", help="Edits apply when the box loses focus (or Ctrl+Enter).")
        if ss.get(builder.JSON_ERROR):
            st.error(f"Invalid JSON ({ss[builder.JSON_ERROR]}): the form and the checks show the last valid config.",
                     icon=":material/data_object:")

    others = [i for f, issues in by_field.items() if f not in paths for i in issues]
    st.subheader("All findings", anchor=False)
    if others:
        st.caption(f"{len(others)} finding(s) about fields the form does not show:")
    report.issues_table(rep)

    st.subheader("Serving", anchor=False)
    draft_dir = st.text_input("Draft folder in the command lines", "<draft-dir>", key="builder_draft_dir",
                              help="Where this config.json will live next to its weights.")
    more = st.text_input("More speculative_config fields (JSON)", "", key="builder_spec_fields",
                         placeholder='{"rejection_sample_method": "block"}',
                         help="Added to both command lines, checked by vLLM's rules with the derived fields.")
    commands = None
    if rep.vllm_speculative_config is not None:
        spec = {**rep.vllm_speculative_config, "model": draft_dir}
        fields, refused, lossy = builder.speculative_fields(more, spec)
        if refused:
            st.error(refused, icon=":material/error:")
        elif lossy:
            st.warning(f"LOSSY: {lossy}", icon=":material/warning:")
        rep.vllm_speculative_config = {**spec, **(fields or {})}
        commands = report.serve_commands(cfg, draft_dir, spec, fields)
    report.serving(rep, commands)
    st.download_button("Download config.json", builder.to_json_bytes(cfg), file_name="config.json",
                       mime="application/json", key="builder_download", icon=":material/download:", type="primary")

show_cli(["validate", "config.json"], label="Equivalent CLI command (after downloading)")
