"""The typed options of `validate` and `repair`: field descriptions are their CLI help."""

from __future__ import annotations

from pydantic import Field

from engine.options import Options


class ValidateOptions(Options):
    """`validate`: vLLM's verdict and ours on a draft folder or a lone config.json."""

    path: str = Field(description="draft folder (config + weights) or a config.json (config only)")
    deep: bool = Field(False, description="check every tensor is finite even in drafts over 4 GiB (smaller ones are "
                       "always checked)", json_schema_extra={"store_true": True})
    verifier: str | None = Field(None, description="verifier folder whose config.json to check against")
    target: str | None = Field(None, description="the target the draft will run with (built-in name, folder or hub "
                               "id): a draft trained for another verifier is an error")


class RepairOptions(Options):
    """`repair`: store the verifier's embedding in a draft that lacks it."""

    path: str = Field(description="draft folder (config.json + safetensors)")
    target: str | None = Field(None, description="the verifier whose embedding to store (built-in name, folder or hub "
                               "id in the local cache); default: the draft's speculators_config.verifier.name_or_path")
    out: str | None = Field(None, description="write the repaired draft to this new folder instead (required for a "
                            "folder the workbench did not write; the source is never changed then)")
    overwrite: bool = Field(False, description="with --out: replace an existing folder there",
                            json_schema_extra={"store_true": True})
