"""Measurement, a floor above training and generation (which never import it): `evaluate` (decoding-exact
acceptance on held-out data), `bench` (methods timed against the baseline on the same prompts) and `step_costs`
(the measured cost of a step and the speedup it forecasts)."""
