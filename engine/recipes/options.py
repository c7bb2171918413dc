"""The typed options of `recipe`: field descriptions are its CLI help."""

from __future__ import annotations

from pydantic import Field

from engine.options import Options
from engine.recipes.spec import STEPS


class RecipeOptions(Options):
    """`recipe`: run a named recipe (data, extraction, training, measurements, the card), or re-measure its draft."""

    name: str = Field(description="recipe name in configs/ or a YAML path")
    only: str | None = Field(None, description=f"comma-separated steps to run ({','.join(STEPS)})")
    force: bool = Field(False, description="re-run steps (and measure the curve, sweep and evaluate records again) "
                        "even if they completed with the same arguments", json_schema_extra={"store_true": True})
    dry_run: bool = Field(False, description="print the commands and every step's resolved options (defaults filled "
                          "in; also with --remeasure); nothing is written", json_schema_extra={"store_true": True})
    remeasure: bool = Field(False, description="measure the recipe's shipped draft again (bench, vllm_bench, sweep, "
                            "evaluate; --only picks) and update those figures in its model card in place: for a "
                            "changed engine or lost records", json_schema_extra={"store_true": True})

    def steps(self) -> list[str] | None:
        """The steps --only names (None: all)."""
        return [s.strip() for s in self.only.split(",")] if self.only else None
