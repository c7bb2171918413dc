"""Recipes and model cards, the floor above measurement: `spec` (a recipe file and the steps it stands for),
`recipe` (running the steps, re-measuring, shipping) and `model_card` (the card written from a recipe's records)."""
