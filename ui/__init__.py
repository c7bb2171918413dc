"""Streamlit-only helpers between the pages and the engine: state, cached models, forms, charts, job panels."""
